"""Registry of schedule generators: one pure function per schedule, looked up by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Layout, Schedule

__all__ = ["Shape", "ScheduleInfo", "register", "build_schedule", "available_schedules", "get_info",
           "check_options", "PLACEMENTS"]

PLACEMENTS = ("loop", "v")
"""How chunks sit on the ranks: ``"loop"``, stage ``s`` on rank ``s % P`` (straight with one
chunk; interleaved 1F1B, WPipe), or ``"v"``, rank ``r`` holding stages ``r`` and ``2P - 1 - r``
(two chunks; zero-bubble V-shape schedules), :meth:`Layout.v_shape`."""


@dataclass(frozen=True)
class Shape:
    """What every generator is asked for.

    Attributes:
        stages: pipeline depth P: ranks of one pipeline copy (stages per copy = P x chunks).
        microbatches: M, micro-batches per iteration (per parallel pipeline).
        iterations: K, iterations (update periods) to lay out.
        chunks: model chunks per rank (interleaved virtual stages; WPipe uses 2).
        width: data-parallel copies of the whole pipeline (micro-batches dealt round-robin).
        replicas: per-stage replica counts (PipeDream 1F1B-RR); overrides ``width``.
        pipelines: AvgPipe's N parallel pipelines sharing the same ranks.
        options: generator-specific settings (e.g. ``advance``, ``vertical_sync``, ``sliced``).
    """

    stages: int
    microbatches: int
    iterations: int = 1
    chunks: int = 1
    width: int = 1
    replicas: tuple[int, ...] | None = None
    pipelines: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches", "iterations", "chunks", "width", "pipelines"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.replicas is not None:
            if len(self.replicas) != self.stages:
                raise ValueError(
                    f"replicas {list(self.replicas)} has {len(self.replicas)} entries; give one per "
                    f"stage ({self.stages})"
                )
            if self.width != 1:
                raise ValueError("give either replicas (per stage) or width (whole pipeline), not both")

    def layout(self, placement: str = "loop") -> Layout:
        """The layout for this shape with chunks placed as ``placement`` says (:data:`PLACEMENTS`);
        a generator that needs the V asks for it, and registers ``placement="v"`` so that anyone
        can find its layout without generating it (:attr:`ScheduleInfo.placement`)."""
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; use one of {list(PLACEMENTS)}")
        if self.replicas is not None:
            if self.chunks != 1:
                raise ValueError("replicated stages are only supported with chunks=1")
            return Layout.replicated(self.replicas)
        if placement == "v":
            if self.chunks != 2:
                raise ValueError(f"a V places exactly two chunks on every rank (rank r holds "
                                 f"stages r and 2P-1-r), got chunks={self.chunks}; use chunks=2")
            return Layout.v_shape(self.stages, self.width)
        return Layout.data_parallel(self.stages, self.width, self.chunks)

    def option(self, name: str, default: Any) -> Any:
        return self.options.get(name, default)


Generator = Callable[[Shape], Schedule]


@dataclass(frozen=True)
class ScheduleInfo:
    """A registered generator and what the CLI says about it."""

    name: str
    description: str
    paper: str
    synchronous: bool
    generate: Generator
    min_microbatches: Callable[[Shape], int] = lambda shape: 1
    """Smallest M the schedule accepts for a shape (e.g. P for 2BW)."""
    options: tuple[str, ...] = ()
    """Names of the options the generator understands; :func:`build_schedule` rejects anything
    else before calling it, so this tuple is the one list (generators check values only)."""
    default_chunks: int = 1
    """Model chunks per rank the schedule is meant for (WPipe's two groups, interleaving);
    what ``pipeweave train`` uses when ``--chunks`` is not given."""
    default_optimizer: tuple[str, Mapping[str, Any]] | None = None
    """``(name, kwargs)`` when the schedule needs a particular optimizer (SpecTrain: SGD with
    momentum); what ``pipeweave train`` uses when ``--optimizer`` is not given."""
    cost: str = ""
    """Work the schedule does beyond one forward and one backward per micro-batch and stage
    (PipeOptim's recomputed forward), in words; ``pipeweave schedules`` prints it."""
    placement: str = "loop"
    """Where its chunks go when ``chunks > 1`` (:data:`PLACEMENTS`): the generated schedule's
    layout is ``shape.layout(placement)``; with one chunk every schedule is straight."""

    def layout(self, shape: Shape) -> Layout:
        """The layout this schedule uses for ``shape``, without generating it."""
        return shape.layout(self.placement if shape.chunks > 1 else "loop")


_REGISTRY: dict[str, ScheduleInfo] = {}


def register(
    name: str,
    *,
    description: str,
    paper: str,
    synchronous: bool,
    min_microbatches: Callable[[Shape], int] | None = None,
    options: Sequence[str] = (),
    default_chunks: int = 1,
    default_optimizer: tuple[str, Mapping[str, Any]] | None = None,
    cost: str = "",
    placement: str = "loop",
) -> Callable[[Generator], Generator]:
    """Decorator registering a generator under ``name``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"schedule {name!r}: unknown placement {placement!r}; use one of "
                         f"{list(PLACEMENTS)}")

    def decorate(fn: Generator) -> Generator:
        if name in _REGISTRY:
            raise ValueError(f"schedule {name!r} is registered twice")
        _REGISTRY[name] = ScheduleInfo(
            name, description, paper, synchronous, fn,
            min_microbatches if min_microbatches is not None else (lambda shape: 1),
            tuple(options), default_chunks, default_optimizer, cost, placement,
        )
        return fn

    return decorate


def get_info(name: str) -> ScheduleInfo:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown schedule {name!r}; choose one of: {known}") from None


def available_schedules() -> list[ScheduleInfo]:
    _load_builtins()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def build_schedule(name: str, shape: Shape | None = None, **kwargs: Any) -> Schedule:
    """Generate the compute-only schedule ``name`` for ``shape`` (or ``Shape(**kwargs)``).

    Extra keyword arguments that are not :class:`Shape` fields go to ``options``.
    """
    info = get_info(name)
    if shape is None:
        fields = set(Shape.__dataclass_fields__)
        options = dict(kwargs.pop("options", {}))
        options.update({k: kwargs.pop(k) for k in list(kwargs) if k not in fields})
        shape = Shape(**kwargs, options=options)
    check_options(name, shape, info.options)
    needed = info.min_microbatches(shape)
    if shape.microbatches < needed:
        raise ValueError(
            f"schedule {name!r} needs microbatches >= {needed} for {shape.stages} stages, got "
            f"{shape.microbatches}; raise --microbatches to at least {needed}"
        )
    return info.generate(shape)


def check_options(name: str, shape: Shape, allowed: Sequence[str]) -> None:
    """Reject options the schedule does not know (a typo would otherwise be silently ignored)."""
    unknown = sorted(set(shape.options) - set(allowed))
    if unknown:
        known = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"schedule {name!r} got unknown option(s) {unknown}; it accepts: {known}")


def _load_builtins() -> None:
    from . import builtin  # noqa: F401  (registers every built-in generator)
