"""The tuner's profile of one (M, N) setting, from a measured or a simulated timeline.

avgpipe.txt §5.2.1: run one setting for a short while and collect, per GPU, "GPU utilization,
computation time, communication time, and memory footprints". :class:`TuningProfile` holds
exactly that, per iteration (all ``N`` pipelines' batches), as plain numbers; it is filled from
``(rank, action_text, start_s, end_s)`` records, which both the simulator
(``SimulationResult.timeline``) and the runtime (``RankResult.records``) produce.

**Utilisation** ``φ^k(t)`` (what Equation 2 scales) is measured from the timeline as the *busy
share* of rank ``k``'s wall time: 0 while it waits, and while it runs a compute action (``F``,
``B``, ``U``, ``AR``, ``AV``: anything but a send or receive) the ``levels`` of the compute
resource, ``(level, fraction of the compute time)`` pairs, by default ``((1.0, 1.0),)``::

    rank0  |F F F F . . . . B B B B|   busy share   1 1 1 1 0 0 0 0 1 1 1 1
    φ histogram: (1, 8 slots of compute), (0, 4 slots of bubble)
    with levels ((1, 0.75), (0, 0.25)): (1, 6 slots), (0, 2 + 4 slots)

* CPU: there is no portable hardware counter, so the timeline's busy share is the base. A
  timeline cannot see inside an action; :func:`pipeweave.avgpipe.simulated.calibrate_levels`
  splits its time into per-sample work (level 1) and per-call overhead that leaves the
  resource idle (level 0: Python, dispatch, small-kernel latency) from the profiler's times
  at two micro-batch sizes.
* CPU, real runs (``busy="host"``): the compute resource is the core the rank's process
  runs on, and it is busy whenever the rank is not waiting: between an iteration's first and
  last action, everything but receives (compute, sends, which copy the message, and the
  interpreter's glue between actions: data loading, dispatch). A simulated timeline has no
  glue, and its waits are receives or gaps, so it keeps the default ``busy="compute"``.
* GPU: the runtime's action records are host times, and kernels run asynchronously, so a
  record shows when work was launched, not when the device ran it (only each iteration's
  end is synchronised). A GPU profile needs the device's view: CUDA events around each
  action for the busy share, and NVML's utilisation counter (``torch.cuda.utilization()``,
  which needs the ``pynvml`` package) sampled during the run for the levels. pipeweave does
  not collect either yet (no GPU to test on); on a GPU the profile below is the host's.

**Per-iteration work** (``U``, ``AV``, ``AR``: each pipeline's optimizer step, the elastic
averaging, a replica all-reduce) is kept apart as ``update_s``: it depends on N, not on the
micro-batches, so Equation 2's ``m*/m`` must not scale it (the tuner adds ``n*/n`` of it).

**Communication** ``𝕋^k``: the transfer time of every message rank ``k`` receives (activations
from ``k-1``, gradients from ``k+1``), each counted once at its receiver, from the per-boundary
message time (``latency + bytes / bandwidth``). A timeline cannot separate a receive's transfer
from waiting for the sender, so receive waits are kept only for reference.

**Memory** ``F^k = fixed + F_mod + F_dat``: ``model_bytes`` are the ``n`` parallel models'
weights, gradients and optimizer states (``F_mod``), ``data_bytes`` the activations held at
the peak (``F_dat``), ``fixed_bytes`` what no setting changes (the reference model, the
process's baseline).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Op, parse_action
from ..schedules.avgpipe import parse_advance

__all__ = ["RankProfile", "TuningProfile", "Record", "Levels", "BUSY", "profile_from_timeline",
           "profile_from_simulation", "busy_segments", "host_segments", "utilisation_histogram"]

Record = tuple[int, str, float, float]
"""``(rank, action text, start, end)``: a timeline record (simulated or measured)."""

Levels = tuple[tuple[float, float], ...]
"""The utilisation while a rank computes: ``(level, fraction of the compute time)`` pairs."""

BUSY: Levels = ((1.0, 1.0),)
"""Fully used whenever busy: the plain busy share."""

_COMM = frozenset({Op.SEND_ACT, Op.RECV_ACT, Op.SEND_GRAD, Op.RECV_GRAD})
_RECV = frozenset({Op.RECV_ACT, Op.RECV_GRAD})
_PER_ITERATION = frozenset({Op.STEP, Op.AVERAGE, Op.ALL_REDUCE})


@dataclass(frozen=True)
class RankProfile:
    """One rank (GPU ``k``) over one iteration of the profiled setting.

    Attributes:
        compute_s: ``T^k_gpu``, busy time on the micro-batches (Equation 2 scales it).
        idle_s: iteration time minus ``compute_s`` and ``update_s`` (blocking
            communication plus bubbles).
        comm_total_s: ``𝕋^k``, transfer time of the messages the rank receives.
        utilisation: ``φ^k`` as ``(level, seconds)`` pairs summing to the iteration time.
        model_bytes: ``F^k_mod``, the parallel models (weights, gradients, optimizer state).
        data_bytes: ``F^k_dat``, activations and inputs held at the peak.
        fixed_bytes: memory no setting changes (reference model, process baseline).
        receive_wait_s: time spent in receives (transfer and waiting), when recorded.
        update_s: per-iteration work of the ``n`` pipelines (optimizer steps, averaging).
    """

    compute_s: float
    idle_s: float
    comm_total_s: float
    utilisation: tuple[tuple[float, float], ...]
    model_bytes: float
    data_bytes: float
    fixed_bytes: float = 0.0
    receive_wait_s: float | None = None
    update_s: float = 0.0

    @property
    def memory_bytes(self) -> float:
        """``F^k``: everything the rank holds at its peak."""
        return self.fixed_bytes + self.model_bytes + self.data_bytes


@dataclass(frozen=True)
class TuningProfile:
    """A profile of one setting: ``microbatches`` (m) x ``pipelines`` (n), per iteration.

    Attributes:
        microbatches: m, micro-batches per batch (per pipeline).
        pipelines: n, parallel pipelines (each trains one batch per iteration).
        iteration_s: measured time of one iteration (all n batches).
        ranks: one :class:`RankProfile` per rank, in pipeline order.
        advance: forwards in advance of 1F1B the profiled run used (0 = 1F1B).
        source: ``"simulated"`` or ``"measured"``.
        batch_size: samples per batch, when known (M must divide it).
        notes: free-form provenance (model, costs, how utilisation was measured).
    """

    microbatches: int
    pipelines: int
    iteration_s: float
    ranks: tuple[RankProfile, ...]
    advance: int = 0
    source: str = "simulated"
    batch_size: int | None = None
    notes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        for name in ("microbatches", "pipelines"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TuningProfile {name} must be an integer >= 1, got {value!r}")
        if not self.ranks:
            raise ValueError("TuningProfile needs at least one rank")
        if not self.iteration_s > 0:
            raise ValueError(f"TuningProfile iteration_s must be > 0 seconds, got {self.iteration_s!r}")

    @property
    def stages(self) -> int:
        return len(self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "microbatches": self.microbatches, "pipelines": self.pipelines,
            "iteration_s": self.iteration_s, "advance": self.advance, "source": self.source,
            "batch_size": self.batch_size, "notes": dict(self.notes),
            "ranks": [{**{k: getattr(r, k) for k in r.__dataclass_fields__},
                       "utilisation": [list(p) for p in r.utilisation]} for r in self.ranks],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TuningProfile":
        ranks = tuple(RankProfile(**{**r, "utilisation": tuple(tuple(p) for p in r["utilisation"])})
                      for r in data["ranks"])
        return cls(microbatches=int(data["microbatches"]), pipelines=int(data["pipelines"]),
                   iteration_s=float(data["iteration_s"]), ranks=ranks,
                   advance=int(data.get("advance", 0)), source=str(data.get("source", "simulated")),
                   batch_size=data.get("batch_size"), notes=dict(data.get("notes") or {}))


def busy_segments(records: Iterable[Record], rank: int, window: tuple[float, float], *,
                  per_iteration: bool = True) -> list[tuple[float, float]]:
    """Merged ``(start, end)`` intervals where ``rank`` runs a compute action, clipped to
    ``window``; without the per-iteration actions (``U``, ``AV``, ``AR``) unless
    ``per_iteration``."""
    skip = _COMM if per_iteration else _COMM | _PER_ITERATION
    lo, hi = window
    return _merge((max(s, lo), min(e, hi)) for r, text, s, e in records
                  if r == rank and parse_action(text).op not in skip and e > lo and s < hi)


def host_segments(records: Iterable[Record], rank: int, window: tuple[float, float],
                  microbatches: int) -> list[tuple[float, float]]:
    """Where ``rank``'s core is busy on the micro-batches (module doc, ``busy="host"``):
    from each iteration's first to its last action, less receives and per-iteration actions.
    """
    lo, hi = window
    spans: dict[int, tuple[float, float]] = {}
    holes = []
    for r, text, s, e in records:
        if r != rank or e <= lo or s >= hi:
            continue
        action = parse_action(text)
        k = (action.microbatch // microbatches if action.microbatch is not None
             else (action.version or 0) - 1)
        first, last = spans.get(k, (s, e))
        spans[k] = (min(first, s), max(last, e))
        if action.op in _RECV or action.op in _PER_ITERATION:
            holes.append((s, e))
    out = []
    for start, end in _merge((max(a, lo), min(b, hi)) for a, b in spans.values()):
        for a, b in _merge(holes):
            if b <= start or a >= end:
                continue
            if a > start:
                out.append((start, a))
            start = max(start, b)
        if end > start:
            out.append((start, end))
    return out


def _merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def utilisation_histogram(segments: Sequence[tuple[float, float]], window: tuple[float, float], *,
                          levels: Levels = BUSY, bin_s: float | None = None
                          ) -> list[tuple[float, float]]:
    """``φ`` over ``window`` as ``(level, seconds)`` pairs, levels merged.

    Exact (``bin_s=None``): ``levels`` while busy, 0 while idle. Binned: each ``bin_s``-long
    bin's busy share times each level (what a sampled counter would show).
    """
    lo, hi = window
    if bin_s is None:
        busy = sum(e - s for s, e in segments)
        pairs = [(level, share * busy) for level, share in levels] + [(0.0, (hi - lo) - busy)]
    else:
        if not bin_s > 0:
            raise ValueError(f"bin_s must be > 0 seconds (or None for exact), got {bin_s!r}")
        pairs = []
        start = lo
        while start < hi:
            end = min(start + bin_s, hi)
            inside = sum(max(0.0, min(e, end) - max(s, start)) for s, e in segments)
            pairs += [(level * inside / (end - start), share * (end - start)) for level, share in levels]
            start = end
    merged: dict[float, float] = {}
    for level, seconds in pairs:
        if seconds > 0:
            merged[level] = merged.get(level, 0.0) + seconds
    return sorted(merged.items(), reverse=True)


def profile_from_timeline(
    records: Iterable[Record],
    *,
    stages: int,
    microbatches: int,
    pipelines: int,
    iterations: int,
    transfer_s: Sequence[float],
    model_bytes: Sequence[float],
    data_bytes: Sequence[float],
    fixed_bytes: Sequence[float] | None = None,
    window: tuple[float, float] | None = None,
    levels: Sequence[Levels] | None = None,
    bin_s: float | None = None,
    busy: str = "compute",
    advance: int = 0,
    source: str = "measured",
    batch_size: int | None = None,
    notes: Mapping[str, Any] | None = None,
) -> TuningProfile:
    """Profile ``iterations`` iterations of a straight ``stages``-rank pipeline from its records.

    Args:
        records: the timeline (rank ``k`` runs stage ``k``).
        transfer_s: one message's time across each boundary (``stages - 1`` values).
        model_bytes, data_bytes, fixed_bytes: per rank, see :class:`RankProfile`.
        window: the interval the ``iterations`` cover (default: first start to last end).
        levels: per rank, the utilisation while it computes (default :data:`BUSY`).
        bin_s: sample the busy share in bins of this length instead of exactly.
        busy: ``"compute"`` (compute actions) or ``"host"`` (all but waiting, module doc).
    """
    records = list(records)
    per_rank = _check_timeline_inputs(records, stages, iterations, transfer_s, model_bytes,
                                      data_bytes, fixed_bytes, busy)
    levels = list(levels) if levels is not None else [BUSY] * stages
    if len(levels) != stages:
        raise ValueError(f"levels has {len(levels)} entries; give one per rank ({stages})")
    if window is None:
        window = (min(start for _, _, start, _ in records), max(end for _, _, _, end in records))
    ranks = tuple(
        _rank_profile(records, k, window, iterations=iterations, microbatches=microbatches,
                      messages=microbatches * pipelines, transfer_s=transfer_s,
                      levels=levels[k], bin_s=bin_s, busy=busy,
                      bytes_=[float(values[k]) for values in per_rank])
        for k in range(stages))
    lo, hi = window
    return TuningProfile(microbatches=microbatches, pipelines=pipelines,
                         iteration_s=(hi - lo) / iterations, ranks=ranks, advance=advance,
                         source=source, batch_size=batch_size, notes=dict(notes or {}))


def _check_timeline_inputs(records: list[Record], stages: int, iterations: int,
                           transfer_s: Sequence[float], model_bytes: Sequence[float],
                           data_bytes: Sequence[float], fixed_bytes: Sequence[float] | None,
                           busy: str) -> list[Sequence[float]]:
    """Refuse what :func:`profile_from_timeline` cannot use; the per-rank model, data and
    fixed bytes (fixed: zeros by default)."""
    if not records:
        raise ValueError("the timeline has no records; profile a run with record_timeline=True")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if len(transfer_s) != stages - 1:
        raise ValueError(f"transfer_s has {len(transfer_s)} values; give one per boundary "
                         f"({stages - 1} for {stages} stages)")
    per_rank = {"model_bytes": model_bytes, "data_bytes": data_bytes,
                "fixed_bytes": fixed_bytes if fixed_bytes is not None else [0.0] * stages}
    for name, values in per_rank.items():
        if len(values) != stages:
            raise ValueError(f"{name} has {len(values)} values; give one per rank ({stages})")
    if busy not in ("compute", "host"):
        raise ValueError(f"busy must be 'compute' or 'host', got {busy!r}")
    return list(per_rank.values())


def _rank_profile(records: list[Record], k: int, window: tuple[float, float], *,
                  iterations: int, microbatches: int, messages: int,
                  transfer_s: Sequence[float], levels: Levels, bin_s: float | None, busy: str,
                  bytes_: list[float]) -> RankProfile:
    """Rank ``k``'s profile over ``window``; ``messages``: each crossing of a boundary, per
    direction, per iteration; ``bytes_``: its model, data and fixed bytes."""
    lo, hi = window
    iteration = (hi - lo) / iterations
    stages = len(transfer_s) + 1
    segments = (busy_segments(records, k, window, per_iteration=False) if busy == "compute"
                else host_segments(records, k, window, microbatches))
    compute = sum(e - s for s, e in segments) / iterations
    update = sum(min(e, hi) - max(s, lo) for r, text, s, e in records
                 if r == k and parse_action(text).op in _PER_ITERATION and e > lo and s < hi)
    received = (transfer_s[k - 1] if k > 0 else 0.0) + (transfer_s[k] if k < stages - 1 else 0.0)
    waits = [min(e, hi) - max(s, lo) for r, text, s, e in records
             if r == k and parse_action(text).op in _RECV and e > lo and s < hi]
    histogram = utilisation_histogram(segments, window, levels=levels, bin_s=bin_s)
    model, data, fixed = bytes_
    return RankProfile(
        compute_s=compute, idle_s=max(iteration - compute - update / iterations, 0.0),
        comm_total_s=messages * received,
        utilisation=tuple((level, seconds / iterations) for level, seconds in histogram),
        model_bytes=model, data_bytes=data, fixed_bytes=fixed,
        receive_wait_s=sum(waits) / iterations if waits else None,
        update_s=update / iterations,
    )


def profile_from_simulation(result: Any, *, model_bytes: Sequence[float],
                            fixed_bytes: Sequence[float] | None = None,
                            data_bytes: Sequence[float] | None = None,
                            levels: Sequence[Levels] | None = None, bin_s: float | None = None,
                            batch_size: int | None = None,
                            notes: Mapping[str, Any] | None = None) -> TuningProfile:
    """Profile from a :class:`pipeweave.sim.SimulationResult` of an ``avgpipe`` (or other
    straight, one-chunk) schedule: its timeline, message times and ``data_bytes`` (default:
    its peak activation bytes)."""
    schedule = result.schedule
    if schedule.num_stages != schedule.num_ranks:
        raise ValueError(f"the tuner models a straight pipeline (one stage per rank); "
                         f"{schedule.name!r} has {schedule.num_stages} stages on "
                         f"{schedule.num_ranks} ranks")
    lo, hi = result.window
    iterations = max(1, round((hi - lo) / result.iteration_time))
    costs = result.costs
    advance = parse_advance(schedule.options.get("advance"), schedule.microbatches)
    return profile_from_timeline(
        result.timeline, stages=schedule.num_stages, microbatches=schedule.microbatches,
        pipelines=schedule.pipelines, iterations=iterations,
        transfer_s=[costs.comm(b) for b in range(schedule.num_stages - 1)],
        model_bytes=model_bytes, fixed_bytes=fixed_bytes,
        data_bytes=result.peak_activation_bytes if data_bytes is None else data_bytes,
        window=result.window, levels=levels, bin_s=bin_s,
        advance=advance, source="simulated",
        batch_size=batch_size, notes=notes,
    )
