"""WPipe's configuration search, Eq. 3 (wpipe.txt §4.2): recompute x d:w (and its isomers) x M.

    T = max( T_s  for s in S_a x S_{d:w} x S_M ),   B = b M w,  M >= d,
    S_a = {True, False},  S_{d:w} = { H(d:w) | d w = N_GPU },  S_M = {d, d+1, ...}

For a given global batch ``B`` (it sets the accuracy, so the paper holds it fixed) and
``N_GPU`` workers, every candidate chooses activation recomputation, a pipeline depth ``d``
and data-parallel width ``w`` with ``d w = N_GPU``, one of the *isomers* ``H(d:w)`` of that
ratio (where the ranks go: :mod:`.placement`, with a topology), and the gradient-accumulation
period ``M >= d``; the micro-batch size ``b = B / (M w)`` must be a whole number. The best
candidate is the highest throughput ``B / iteration time`` among those whose peak memory per
worker fits the bound (§4.2.1: 2BW "due to memory limitations" needs ``d >= 8``).

The paper leaves the time of a candidate to PipeDream-2BW's planner ("the study in (Narayanan
et al., 2021) gives a workable solution"), so :func:`wpipe_search` takes the estimate as a
function: ``pipeweave auto`` passes its simulator's; :class:`PaperModel` is one from the
paper's own terms (module of its own below, stated there), for comparison and for tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .placement import placements
from .topology import Topology

__all__ = ["WPipeConfig", "Estimate", "Scored", "configuration_space", "wpipe_search",
           "PaperModel"]

Table = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class WPipeConfig:
    """One point of Eq. 3's space.

    Attributes:
        recompute: activation recomputation (``S_a``).
        depth, width: ``d`` and ``w``, ``d w = N_GPU``.
        microbatches: ``M``, micro-batches per pipeline copy per update (``>= d``).
        microbatch_size: ``b``, samples per micro-batch; ``B = b M w``.
        placement: the isomer's name (:mod:`.placement`: ``pipeline-inner``, ``data-inner``,
            ``mixed a/b``); ``table[stage][replica]`` is its rank map.
        p2p_bandwidth: the isomer's link per pipeline boundary (``d - 1`` values).
        allreduce_bandwidth: the isomer's all-reduce link per stage (``inf``: ``w = 1``).
    """

    recompute: bool
    depth: int
    width: int
    microbatches: int
    microbatch_size: int
    placement: str
    table: Table
    p2p_bandwidth: tuple[float, ...]
    allreduce_bandwidth: tuple[float, ...]

    @property
    def global_batch(self) -> int:
        return self.microbatch_size * self.microbatches * self.width


@dataclass(frozen=True)
class Estimate:
    """What a candidate costs: seconds per iteration (one update of ``B`` samples) and the
    peak bytes on the fullest worker."""

    iteration_time: float
    peak_memory: float


@dataclass(frozen=True)
class Scored:
    config: WPipeConfig
    estimate: Estimate
    fits: bool

    @property
    def throughput(self) -> float:
        """Samples per second, ``B / iteration time`` (Eq. 3's ``T``)."""
        return self.config.global_batch / self.estimate.iteration_time


def configuration_space(global_batch: int, gpus: int, *, topology: Topology | None = None,
                        max_microbatches: int | None = None) -> list[WPipeConfig]:
    """Every ``(recompute, d, w, isomer, M)`` with ``b = B / (M w)`` whole and ``M >= d``.

    ``S_M = {d, d+1, ...}`` is finite here because ``b >= 1``: ``M <= B / w``
    (``max_microbatches`` cuts it further). Without a topology every link is free and each
    ``d:w`` has one isomer (the runtime's map).
    """
    for label, value in (("global_batch", global_batch), ("gpus", gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    topology = topology if topology is not None else Topology.single(gpus)
    if topology.workers != gpus:
        raise ValueError(f"the topology {topology} has {topology.workers} workers but gpus is "
                         f"{gpus}; make the product of the machine counts equal gpus")
    space = []
    for depth in (d for d in range(1, gpus + 1) if gpus % d == 0):
        width = gpus // depth
        isomers = placements(topology, depth, width, p2p_bytes=0.0, allreduce_bytes=0.0)
        limit = global_batch // width
        if max_microbatches is not None:
            limit = min(limit, max_microbatches)
        for microbatches in range(depth, limit + 1):
            size, rest = divmod(global_batch, microbatches * width)
            if rest:
                continue
            for isomer in isomers:
                name = isomer.name if isomer.name != "mixed" else (
                    "mixed " + "x".join(map(str, isomer.pipeline_split)) + "/"
                    + "x".join(map(str, isomer.data_split)))
                for recompute in (False, True):
                    space.append(WPipeConfig(recompute, depth, width, microbatches, size, name,
                                             isomer.table, isomer.p2p_bandwidth,
                                             isomer.allreduce_bandwidth))
    return space


def wpipe_search(space: Sequence[WPipeConfig], estimate: Callable[[WPipeConfig], Estimate],
                 *, memory_limit: float | None = None) -> list[Scored]:
    """Eq. 3: every candidate scored, best first.

    The candidates that fit ``memory_limit`` come first, by throughput (highest first), then
    by peak memory (lowest first); then those that do not fit, in the same order. The first
    entry is Eq. 3's answer when it fits; when none fits the caller sees ``fits=False``.
    """
    if memory_limit is not None and not memory_limit > 0:
        raise ValueError(f"memory_limit must be > 0 bytes, got {memory_limit!r}")
    scored = []
    for config in space:
        cost = estimate(config)
        if not cost.iteration_time > 0:
            raise ValueError(f"the estimate of {config} has iteration time "
                             f"{cost.iteration_time!r}; it must be > 0 seconds")
        fits = memory_limit is None or cost.peak_memory <= memory_limit
        scored.append(Scored(config, cost, fits))
    return sorted(scored, key=lambda s: (not s.fits, -s.throughput, s.estimate.peak_memory))


@dataclass(frozen=True)
class PaperModel:
    """An estimate from the paper's own terms, per sample of the whole model.

    Ours, not the paper's (it gives no time model): its terms added, nothing overlapped::

        compute    = M b (forward (1 + recompute) + backward) / d    (2GW: no bubble, Table 1)
        p2p        = M 2(2d - 1) C_a,  C_a = b boundary_bytes / slowest boundary link
                     (§3.4's C_WPipe per micro-batch; 0 for d = 1)
        all-reduce = 4 (w-1)/w (parameter_bytes / d) / slowest all-reduce link
        memory     = (2 parameter_bytes + optimizer_bytes) / d     (weights and Table 1's
                     weight buffer S_m = S_p)
                     + M b activation_bytes / d     (§3.3: stage 0 holds 2M chunk activations
                                                     of S_a / 2N each)
                     or  b activation_bytes / 2d    with recomputation (Table 1: 0.5 S_a)

    Attributes:
        forward, backward: seconds per sample through the whole model.
        activation_bytes: ``S_a`` per sample, the whole model's stashed activations.
        boundary_bytes: bytes per sample crossing a stage boundary (``C_a``'s size).
        parameter_bytes: ``S_p``; optimizer_bytes: the optimizer state of the whole model.
    """

    forward: float
    backward: float
    activation_bytes: float
    boundary_bytes: float
    parameter_bytes: float
    optimizer_bytes: float = 0.0

    def __call__(self, config: WPipeConfig) -> Estimate:
        d, w, m, b = config.depth, config.width, config.microbatches, config.microbatch_size
        compute = m * b * (self.forward * (2 if config.recompute else 1) + self.backward) / d
        link = min(config.p2p_bandwidth, default=math.inf)
        p2p = 0.0 if math.isinf(link) else m * 2 * (2 * d - 1) * b * self.boundary_bytes / link
        group = min(config.allreduce_bandwidth, default=math.inf)
        reduce = 0.0 if w == 1 or math.isinf(group) else \
            4.0 * (w - 1) / w * (self.parameter_bytes / d) / group
        weights = (2 * self.parameter_bytes + self.optimizer_bytes) / d
        held = b * self.activation_bytes / (2 * d) if config.recompute else \
            m * b * self.activation_bytes / d
        return Estimate(compute + p2p + reduce, weights + held)
