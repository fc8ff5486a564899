"""What ``pipeweave auto`` is asked (:class:`AutoProblem`) and what one candidate is (:class:`Candidate`).

A candidate fixes every axis of the search: schedule, partition method, micro-batches M,
chunks per rank, parallel pipelines N, pipeline depth d and data-parallel width w
(``d * w = ranks``), recomputation (how many leading stages recompute), APC and how each
stage is held over its ``w`` data-parallel ranks (``shard``: replicated, ZeRO-2 or ZeRO-3,
docs/sharding.md) and over how many tensor-parallel processes each rank's stage is split
(``tp``: ``d * w * tp = ranks``, :mod:`pipeweave.auto.tensor_parallel`). The global
batch B (samples per iteration of one pipeline) is fixed for the whole search, as in WPipe's
Eq. 3 (``B = b * M * w``: "since B directly affects the accuracy of the model, it is often a
given value"): a candidate's micro-batch holds ``b = B / M`` samples, and its per-block costs
are the profile's scaled to ``b`` (:mod:`pipeweave.auto.scaling`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..planner.topology import Topology
from ..profiler import Profile
from ..schedules import get_info
from ..sim.costs import check_shared_cores

__all__ = ["AutoProblem", "Candidate", "SEMANTICS", "TRAINING", "allows", "check_settings"]

SEMANTICS = ("exact", "averaged", "any")
"""Named by what the user keeps (``--semantics``): ``exact`` (the default), only plans whose
updates equal training the same batch in one process (1F1B, GPipe, interleaved, zero-bubble,
V, DualPipeV, sliced, with any partition, M, width and recomputation); ``averaged``, also
AvgPipe's N > 1 parallel pipelines (N models, each updated on its own batch and averaged
elastically: another learning rule, N times the samples per iteration); ``any``, also the
asynchronous schedules and APC (stale weights, lossy messages)."""

TRAINING = ("exact", "averaged", "stale weights", "lossy messages")
"""What training a candidate keeps (:meth:`Candidate.training`), from the most faithful."""

_ALLOWED = {"exact": TRAINING[:1], "averaged": TRAINING[:2], "any": TRAINING}


def allows(semantics: str, training: str) -> bool:
    """Whether ``--semantics semantics`` admits a plan that keeps ``training``."""
    return training in _ALLOWED[semantics]


def check_settings(*, ranks: object, batch_size: object = None, memory_limit: object = None,
                   semantics: str = "exact", topology: Topology | None = None,
                   shared_cores: object = None, optimizer: str = "adam",
                   time_limit: object = None, recompute: tuple[int, ...] | None = None) -> None:
    """The checks of an :class:`AutoProblem` that need no profile, so that ``pipeweave auto``
    can run them before it profiles anything."""
    check_shared_cores(shared_cores)
    for count in recompute or ():
        _check_recompute(count)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"--ranks must be an integer >= 1, got {ranks!r}")
    if semantics not in SEMANTICS:
        raise ValueError(f"--semantics {semantics!r} is not one of {list(SEMANTICS)}; use "
                         f"exact (same updates as one process), averaged (AvgPipe too) or any "
                         f"(asynchronous schedules and APC too)")
    if time_limit is not None and not time_limit > 0:  # type: ignore[operator]
        raise ValueError(f"--time-limit must be > 0 seconds, got {time_limit!r}")
    if memory_limit is not None and not memory_limit > 0:  # type: ignore[operator]
        raise ValueError(f"--memory-limit must be > 0 bytes, got {memory_limit!r}")
    from ..memory import OPTIMIZER_STATE

    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r} has no known state size; choose one "
                         f"of {', '.join(sorted(OPTIMIZER_STATE))}")
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"--batch-size must be an integer >= 1, got {batch_size!r}")
    if topology is not None and topology.workers != ranks:
        raise ValueError(
            f"the topology {topology} has {topology.workers} workers but --ranks is "
            f"{ranks}; make the product of the machine counts equal --ranks")


@dataclass(frozen=True)
class AutoProblem:
    """A search problem.

    Attributes:
        profile: per-block costs of one micro-batch of ``profile.batch_size`` samples.
        ranks: workers to use.
        batch_size: B, samples per iteration of one pipeline (default: the profile's
            micro-batch times ``2 * ranks``, i.e. the default plan's micro-batch).
        memory_limit: bytes per rank; a candidate predicted above it is never chosen.
        semantics: ``"exact"``, ``"averaged"`` or ``"any"`` (:data:`SEMANTICS`).
        topology: hierarchical levels (default: one level at the profile's link).
        shared_cores: the ranks share this many CPU cores (``Costs.shared_cores``).
        optimizer: the optimizer whose state the memory model counts.
        extra_profiles: the same model profiled at other micro-batch sizes; the block times
            at a candidate's micro-batch are interpolated between them
            (:mod:`pipeweave.auto.scaling`).
        time_limit: seconds the search may take; when they are spent the candidates not yet
            examined are left out (counted as ``unexamined``) and the best found so far wins.
            Candidates are examined best bound first, so what is left had the weakest bounds.
            ``None``: search everything.
        schedules, methods, microbatches, pipelines, depths, recompute, apc, shard: restrict
            an axis to these values (``None``: the axis's own values, :mod:`pipeweave.auto.axes`).
            ``recompute`` counts leading stages that recompute (0: none; a count at or above
            a candidate's stages: all of them).
        table_rows: rows the caller's table shows (``auto --top``): the memory model is asked
            of the simulated candidates that could not win, fastest first, only until this
            many that fit the memory limit are known to be faster than the rest, so the first
            ``table_rows`` of ``ranked`` are what asking all of them gives. ``None``: the
            fastest ``TABLE_MEMORY`` of them (more points on the plot, more memory analyses).
    """

    profile: Profile
    ranks: int
    batch_size: int | None = None
    memory_limit: float | None = None
    semantics: str = "exact"
    topology: Topology | None = None
    shared_cores: int | None = None
    optimizer: str = "adam"
    extra_profiles: tuple[Profile, ...] = ()
    time_limit: float | None = None
    schedules: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    pipelines: tuple[int, ...] | None = None
    depths: tuple[int, ...] | None = None
    recompute: tuple[int, ...] | None = None
    apc: tuple[bool, ...] | None = None
    shard: tuple[str, ...] | None = None
    tp: tuple[int, ...] | None = None
    """Tensor-parallel sizes to search (``None``: 1 only); only for a model the runtime can
    split (its caller checks: ``pipeweave auto --model`` asks the runtime's
    ``check_parallelizable``) and a profile that records the split (:mod:`.tensor_parallel`)."""
    table_rows: int | None = None

    def __post_init__(self) -> None:
        if self.table_rows is not None and (isinstance(self.table_rows, bool) or
                                            not isinstance(self.table_rows, int) or
                                            self.table_rows < 1):
            raise ValueError(f"table_rows={self.table_rows!r}: give the table's rows as an "
                             "int >= 1, or None for the fastest TABLE_MEMORY")
        for size in self.tp or ():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"tp={size!r}: give tensor-parallel sizes as ints >= 1")
        check_settings(ranks=self.ranks, batch_size=self.batch_size,
                       memory_limit=self.memory_limit, semantics=self.semantics,
                       topology=self.topology, shared_cores=self.shared_cores,
                       optimizer=self.optimizer, time_limit=self.time_limit,
                       recompute=self.recompute)
        if self.profile.batch_size is None:
            raise ValueError(f"profile of {self.profile.model!r} has no batch_size (samples per "
                             "micro-batch); auto scales the block costs to each candidate's "
                             "micro-batch from it: set it in the profile JSON")
        for other in self.extra_profiles:
            if other.num_blocks != self.profile.num_blocks or other.batch_size is None:
                raise ValueError(
                    f"the profiles to interpolate between must be of the same model with a "
                    f"batch_size each; got {other.model!r} ({other.num_blocks} blocks, batch_size "
                    f"{other.batch_size}) beside {self.profile.model!r} "
                    f"({self.profile.num_blocks} blocks)")

    @property
    def batch(self) -> int:
        """B, samples per iteration of one pipeline."""
        if self.batch_size is not None:
            return self.batch_size
        assert self.profile.batch_size is not None
        return self.profile.batch_size * self.default_microbatches

    @property
    def default_microbatches(self) -> int:
        """The default plan's M: ``2 * ranks``, as ``pipeweave plan`` uses."""
        return 2 * self.ranks


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (module docstring).

    ``recompute`` is how many leading stages (pipeline order, virtual stages with chunks)
    recompute their activations in the backward: 0 none, ``stages`` or more all of them
    (docs/auto.md, "Recomputation per stage", says why a prefix). ``bounds`` and
    ``replicas`` are filled when the partition method has run; ``options`` are the
    schedule's options (e.g. the Slicer's stage costs).
    """

    schedule: str
    method: str
    depth: int
    width: int
    chunks: int
    pipelines: int
    microbatches: int
    recompute: int
    apc: bool
    shard: str = "none"
    tp: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    bounds: tuple[tuple[int, int], ...] | None = None
    replicas: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_recompute(self.recompute)

    def training(self) -> str:
        """What training this plan keeps (:data:`TRAINING`): stale weights for an
        asynchronous schedule, lossy messages with APC, averaged with N > 1 pipelines."""
        if not get_info(self.schedule).synchronous:
            return "stale weights"
        if self.apc:
            return "lossy messages"
        return "averaged" if self.pipelines > 1 else "exact"

    @property
    def stages(self) -> int:
        """Stages of one pipeline copy (``depth * chunks`` before replication)."""
        return self.depth * self.chunks

    def recomputed(self, stages: int) -> tuple[bool, ...]:
        """Per stage of a ``stages``-stage plan, whether it recomputes (``()``: none does,
        as :attr:`Plan.recompute <pipeweave.planner.plan.Plan.recompute>` writes it)."""
        return tuple(s < self.recompute for s in range(stages)) if self.recompute else ()

    def recompute_label(self, stages: int) -> str:
        """``none``, ``all`` or ``k/S`` (the first k of S stages)."""
        count = min(self.recompute, stages)
        return "none" if count == 0 else "all" if count == stages else f"{count}/{stages}"

    def label(self) -> dict[str, Any]:
        """The axes' values, as plain data."""
        return {"schedule": self.schedule, "method": self.method, "depth": self.depth,
                "width": self.width, "chunks": self.chunks, "pipelines": self.pipelines,
                "microbatches": self.microbatches, "recompute": self.recompute, "apc": self.apc,
                "shard": self.shard, "tp": self.tp}


def _check_recompute(count: object) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TypeError(f"recompute={count!r}: give how many leading stages recompute, an "
                        "integer >= 0 (0: none; a large number, e.g. 10**9: every stage)")
