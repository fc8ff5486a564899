"""Registry of schedule generators: one pure function per schedule, looked up by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..ir import Layout, Schedule, lower

__all__ = ["Shape", "ScheduleInfo", "register", "build_schedule", "lowered_schedule",
           "available_schedules", "get_info", "check_options", "PLACEMENTS", "CAPABILITIES",
           "CACHE_SIZE"]

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
        return _layout(placement, self.stages, self.width, self.chunks, self.replicas)

    def option(self, name: str, default: Any) -> Any:
        return self.options.get(name, default)

    def __hash__(self) -> int:
        """Hashable (options by their JSON text), so that :func:`build_schedule` can remember
        what it built for a shape."""
        return hash((self.stages, self.microbatches, self.iterations, self.chunks, self.width,
                     self.replicas, self.pipelines,
                     json.dumps(dict(self.options), sort_keys=True, default=repr)))



@lru_cache(maxsize=256)
def _layout(placement: str, stages: int, width: int, chunks: int,
            replicas: tuple[int, ...] | None) -> Layout:
    """:meth:`Shape.layout`, kept for the last 256 arguments: a search asks the layout of
    one shape for every partition, recompute prefix and check (a 1,024-rank layout checks
    every rank when made); layouts are immutable, so one object serves them all."""
    if replicas is not None:
        if chunks != 1:
            raise ValueError("replicated stages are only supported with chunks=1")
        return Layout.replicated(replicas)
    if placement == "v":
        if chunks != 2:
            raise ValueError(f"a V places exactly two chunks on every rank (rank r holds "
                             f"stages r and 2P-1-r), got chunks={chunks}; use chunks=2")
        return Layout.v_shape(stages, width)
    return Layout.data_parallel(stages, width, chunks)

Generator = Callable[[Shape], Schedule]


@dataclass(frozen=True)
class ScheduleInfo:
    """A registered generator and everything the rest of pipeweave asks about it.

    Nothing outside :mod:`pipeweave.schedules` tests a schedule's name: ``train``, ``simulate``,
    ``auto``, the memory estimates and checkpoints read these fields, so a new schedule joins
    them by its entry alone (``tests/auto/test_new_schedule.py`` registers one and runs it
    through all of them). What the generator really builds is checked against the declared
    fields by :func:`pipeweave.schedules.declared.mismatches` (a test runs it on every entry).
    """

    name: str
    """What ``--schedule``, ``Plan.schedule`` and the generated ``Schedule.name`` call it."""
    description: str
    """One line for ``pipeweave schedules``."""
    paper: str
    """Where the schedule comes from (authors, title, venue, section)."""
    synchronous: bool
    """Every iteration ends with a flush (all backwards, then the updates), so its gradients
    are those of non-pipelined training; ``auto`` searches an asynchronous one only when told
    ``--semantics any``."""
    generate: Generator
    """The pure function from a :class:`Shape` to the compute-only schedule."""
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
    pipelines: bool = False
    """It lays out N > 1 parallel pipelines on the same ranks (``Shape.pipelines``; AvgPipe's
    elastic averaging), and takes the flags that go with them (``--pipelines``, ``--alpha``,
    ``--average-order``, ``--advance``)."""
    width: bool = False
    """It runs data-parallel copies of the whole pipeline (``Shape.width`` > 1)."""
    replicas: bool = False
    """It runs per-stage replica counts (``Shape.replicas``; PipeDream's 1F1B-RR)."""
    chunks: tuple[int, ...] | None = (1,)
    """The model-chunk counts per rank it lays out (``Shape.chunks``); ``None``: any count."""
    split_backward: bool = False
    """Some of its backwards are split into I and W (zero-bubble schedules), so the gradient a
    stage sends back may be ready after the I alone (``auto``'s bounds allow for it)."""
    semantics: tuple[str, ...] = ()
    """The weight-semantics options (:class:`pipeweave.planner.Semantics` fields) that change
    what it computes; ``check_semantics`` refuses the others on this schedule."""
    prediction: str | None = None
    """How its forwards predict weights ahead: ``"optimizer"`` (PipeOptim: the optimizer's own
    last step, where the program marks a forward predicted), ``"momentum"`` (SpecTrain: SGD's
    momentum buffer, on every stage, forwards and backwards), or ``None`` (no prediction)."""
    checkpointable: bool = True
    """``--checkpoint-dir``/``--resume`` can stop and resume it exactly (every rank reaches a
    point after each iteration with nothing of that iteration in flight)."""
    online_advance: bool = False
    """It runs under the online advance controller (``--advance auto``, AvgPipe's
    Algorithm 1), which lays it out one iteration at a time with the ``advance`` option."""
    torch_schedule: str | None = None
    """The ``torch.distributed.pipelining`` schedule that runs the same order, by the name
    ``get_schedule_class`` and torchtitan's ``pipeline_parallel_schedule`` take (``"1F1B"``);
    ``None``: torch has none (:mod:`pipeweave.planner.interchange`)."""
    sliced: str | None = None
    """The schedule that runs this one with AutoPipe's Slicer (the first micro-batches split,
    option ``sliced``), which ``plan --slicer`` switches to; ``None``: the Slicer does not apply."""

    def layout(self, shape: Shape) -> Layout:
        """The layout this schedule uses for ``shape``, without generating it."""
        return shape.layout(self.placement if shape.chunks > 1 else "loop")

    def takes_chunks(self, chunks: int) -> bool:
        """It lays out ``chunks`` model chunks per rank (:attr:`chunks`)."""
        return self.chunks is None or chunks in self.chunks


_REGISTRY: dict[str, ScheduleInfo] = {}

Capability = bool | str | tuple[int, ...] | tuple[str, ...] | Callable[[int, int, int], int] | None
"""The type of a declared field passed to :func:`register` (``capabilities``)."""

CAPABILITIES = ("pipelines", "width", "replicas", "chunks", "split_backward", "semantics",
                "prediction", "checkpointable", "online_advance", "sliced", "torch_schedule")
"""The :class:`ScheduleInfo` fields :func:`register` takes as ``**capabilities``."""


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
    **capabilities: Capability,
) -> Callable[[Generator], Generator]:
    """Decorator registering a generator under ``name``; ``capabilities``: the declared
    fields of :class:`ScheduleInfo` named in :data:`CAPABILITIES` (``checkpointable``
    defaults to ``synchronous``)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"schedule {name!r}: unknown placement {placement!r}; use one of "
                         f"{list(PLACEMENTS)}")
    unknown = sorted(set(capabilities) - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"schedule {name!r}: unknown field(s) {unknown}; declare any of "
                         f"{list(CAPABILITIES)}")
    capabilities.setdefault("checkpointable", synchronous)

    def decorate(fn: Generator) -> Generator:
        if name in _REGISTRY:
            raise ValueError(f"schedule {name!r} is registered twice")
        _REGISTRY[name] = ScheduleInfo(
            name=name, description=description, paper=paper, synchronous=synchronous,
            generate=fn,
            min_microbatches=min_microbatches if min_microbatches is not None else _one,
            options=tuple(options), default_chunks=default_chunks,
            default_optimizer=default_optimizer, cost=cost, placement=placement,
            **capabilities,  # type: ignore[arg-type]
        )
        return fn

    return decorate


def _one(shape: Shape) -> int:
    return 1


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

    Extra keyword arguments that are not :class:`Shape` fields go to ``options``. The result
    is remembered for the last :data:`CACHE_SIZE` (generator, shape) pairs: a schedule is
    immutable data, and the search, the memory model and the runtime ask for the same shape
    many times (one partition after another).
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
    return _generated(info.generate, shape)


def lowered_schedule(name: str, shape: Shape) -> Schedule:
    """:func:`build_schedule` with its sends and receives inserted (:func:`pipeweave.ir.lower`),
    as the runtime and the memory model read it; remembered like :func:`build_schedule`."""
    build_schedule(name, shape)  # checks the shape, and remembers the compute-only schedule
    return _lowered(get_info(name).generate, shape)


CACHE_SIZE = 8
"""Schedules :func:`build_schedule` and :func:`lowered_schedule` keep (least recently used
dropped): a 256-rank x 256-micro-batch schedule holds a few hundred MB of actions."""


@lru_cache(maxsize=CACHE_SIZE)
def _generated(generate: Generator, shape: Shape) -> Schedule:
    return generate(shape)


@lru_cache(maxsize=CACHE_SIZE)
def _lowered(generate: Generator, shape: Shape) -> Schedule:
    return lower(_generated(generate, shape))


def check_options(name: str, shape: Shape, allowed: Sequence[str]) -> None:
    """Reject options the schedule does not know (a typo would otherwise be silently ignored)."""
    unknown = sorted(set(shape.options) - set(allowed))
    if unknown:
        known = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"schedule {name!r} got unknown option(s) {unknown}; it accepts: {known}")


def _load_builtins() -> None:
    from . import builtin  # noqa: F401  (registers every built-in generator)
