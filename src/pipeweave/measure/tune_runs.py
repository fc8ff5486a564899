"""The tuner's real runs (``pipeweave tune --source measure``, ``benchmarks/avgpipe_tuner.py``).

:func:`run_setting` runs one setting for real (§5.1's short run): ``avgpipe`` with ``N``
parallel pipelines and ``M`` micro-batches on ``stages`` processes
(:func:`pipeweave.runtime.launch_local`), ``warmup`` iterations and then ``iterations`` timed
ones, each run alone at advance 0 (``AdvanceOptions(fixed=0)``), so the runtime itself times
every iteration (the slowest rank's, shared by one ``all_reduce``) and counts every rank's
memory (:mod:`pipeweave.runtime.observation.memory`). A :class:`RealRun` is both a
traversal's measurement (:meth:`RealRun.measurement`: median iteration, counted peak) and the
tuner's profile (:func:`profile_real_run`: timeline, transfers, memory split). The simulated
source is :mod:`pipeweave.measure.tune_model`.

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..avgpipe.profile import Levels, Record, TuningProfile, profile_from_timeline
from ..avgpipe.simulated import work_levels
from ..avgpipe.tuner import Measurement
from ..planner.evaluate import Network
from .tune_model import LOOPBACK_BANDWIDTH

__all__ = ["RealRun", "run_setting", "profile_real_run"]


@dataclass(frozen=True)
class RealRun:
    """What a short real run of one setting measured (:func:`run_setting`).

    Attributes:
        model, stages, microbatches, pipelines, batch_size: the setting (``batch_size``
            samples per batch, per pipeline).
        iteration_s: every timed iteration, the slowest rank's time (the runtime's).
        peak_bytes: per rank, counted model state + activations at the peak (the runtime's
            :mod:`~pipeweave.runtime.observation.memory`), the largest over the timed iterations.
        activation_bytes: per rank, the peak activations alone (``F_dat``).
        model_bytes: per rank, the ``N`` parallel models' weights, gradients and optimizer
            state (``F_mod``); ``peak - activations - model`` is the reference model.
        rss_bytes: per rank, peak resident set (CPU) or ``max_memory_allocated`` (GPU), for
            reference: RSS counts the torch runtime and never goes down.
        message_bytes: per boundary, one activation (or gradient) message, from the bytes
            the ranks sent.
        records: the timeline, ``(rank, action, start, end)`` seconds since a common origin.
        window: ``(start, end)`` of the timed iterations in ``records``.
        wall_s: the run from launch to results (what a traversal pays per setting).
    """

    model: str
    stages: int
    microbatches: int
    pipelines: int
    batch_size: int
    iteration_s: tuple[float, ...]
    peak_bytes: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    model_bytes: tuple[float, ...]
    rss_bytes: tuple[float, ...]
    message_bytes: tuple[float, ...]
    records: tuple[Record, ...]
    window: tuple[float, float]
    wall_s: float

    @property
    def median_s(self) -> float:
        """The setting's iteration time: the median of the timed iterations."""
        return statistics.median(self.iteration_s)

    def measurement(self) -> Measurement:
        """A traversal's view: median iteration time and the fullest rank's counted peak."""
        return Measurement(self.microbatches, self.pipelines, self.median_s, max(self.peak_bytes),
                           extra={"memory_per_rank": list(self.peak_bytes),
                                  "activation_bytes": list(self.activation_bytes),
                                  "rss_per_rank": list(self.rss_bytes),
                                  "iterations_s": list(self.iteration_s), "wall_s": self.wall_s})


def run_setting(model: str, *, stages: int, microbatches: int, pipelines: int = 1,
                batch_size: int, warmup: int = 1, iterations: int = 10, device: str = "cpu",
                timeout_s: float = 120.0, seed: int = 0) -> RealRun:
    """Run ``avgpipe`` at ``(M, N)`` for real on ``stages`` local processes (module doc).

    ``warmup`` iterations (start-up: allocator, thread pools, first messages) are run and left
    out; the next ``iterations`` are timed. ``N = 1`` runs ``avgpipe`` too (1F1B, averaging
    with one pipeline changes nothing), so every setting is the same program.
    """
    from ..runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local
    from ..runtime.advance.options import AdvanceOptions
    from ..runtime.observation.memory import estimate_state_bytes
    from ..runtime.observation.summary import iteration_end_times

    if warmup < 1 or iterations < 1:
        raise ValueError(f"a real run needs warmup >= 1 and iterations >= 1, got warmup={warmup}, "
                         f"iterations={iterations}; e.g. warmup=1, iterations=10 "
                         f"(avgpipe.txt §5.1)")
    if batch_size % microbatches:
        raise ValueError(f"M={microbatches} does not divide the batch size {batch_size}; "
                         f"use a divisor of {batch_size}")
    builtin = BuiltinModel(model, seed=seed)
    spec = builtin()
    plan = Plan.uniform(len(spec.blocks), stages, schedule="avgpipe", microbatches=microbatches,
                        pipelines=pipelines)
    steps = warmup + iterations
    optimizer = OptimizerFactory("adam", {"lr": 1e-3})
    job = Job(plan=plan, steps=steps, model=builtin, optimizer=optimizer, seed=seed,
              data=BuiltinData(spec.dataset or "digits", batch_size=batch_size,
                               seq_len=_seq_len(model, spec.dataset), seed=seed),
              device=device, timeout_s=timeout_s, advance=AdvanceOptions(fixed=0))
    started = time.perf_counter()
    results = launch_local(job, deadline_s=timeout_s * 2)
    wall = time.perf_counter() - started
    timed = results[0].advance_log[warmup:]  # the same numbers on every rank
    records = tuple(r for result in results for r in result.records)
    ends = iteration_end_times(records, microbatches, steps)
    sent = [float(r.bytes_sent) for r in sorted(results, key=lambda r: r.rank)]
    return RealRun(
        model=model, stages=stages, microbatches=microbatches, pipelines=pipelines,
        batch_size=batch_size, iteration_s=tuple(e["measured_s"] for e in timed),
        peak_bytes=_per_rank_max(timed, "peak_bytes_per_rank"),
        activation_bytes=_per_rank_max(timed, "activation_bytes_per_rank"),
        model_bytes=tuple(float(b) for b in estimate_state_bytes(spec, plan, optimizer,
                                                                 averaging=False)),
        rss_bytes=tuple(float(r.peak_memory_bytes) for r in sorted(results, key=lambda r: r.rank)),
        message_bytes=_message_bytes(sent, steps * microbatches * pipelines),
        records=records, window=(ends[warmup - 1], ends[-1]), wall_s=wall,
    )


def profile_real_run(run: RealRun, *, network: Network | None = None,
                     levels: Sequence[Levels] | None = None,
                     per_sample_s: Sequence[float] | None = None) -> TuningProfile:
    """The tuner's profile of a real run (§5.2.1).

    Per rank: the busy time from the timeline of the timed iterations (``busy="host"``:
    everything but waiting in receives, see :mod:`pipeweave.avgpipe.profile`), apart from the
    per-iteration steps and averaging; the transfer time of the messages it receives
    (``network``: this machine's loopback by default); ``F_mod`` (the parallel models),
    ``F_dat`` (peak activations) and the rest of the counted peak as fixed (the reference
    model). The iteration time is the run's median.

    The utilisation while busy: ``levels`` as given, or from ``per_sample_s`` (per rank, the
    profiler's seconds per sample, :func:`~pipeweave.avgpipe.simulated.per_sample_seconds`):
    the ``per_sample_s x samples`` of an iteration are work (level 1), the rest of the busy
    time overhead (level 0); default: level 1 throughout.
    """
    network = network if network is not None else Network(bandwidth=LOOPBACK_BANDWIDTH)
    fixed = [max(peak - act - mod, 0.0) for peak, act, mod
             in zip(run.peak_bytes, run.activation_bytes, run.model_bytes)]

    def profile(levels: Sequence[Levels] | None, how: str) -> TuningProfile:
        return profile_from_timeline(
            run.records, stages=run.stages, microbatches=run.microbatches,
            pipelines=run.pipelines, iterations=len(run.iteration_s),
            transfer_s=[network.latency + b / network.boundary(k)
                        for k, b in enumerate(run.message_bytes)],
            model_bytes=run.model_bytes, data_bytes=run.activation_bytes, fixed_bytes=fixed,
            window=run.window, levels=levels, busy="host", source="measured",
            batch_size=run.batch_size,
            notes={"model": run.model, "iterations": len(run.iteration_s), "schedule": "avgpipe",
                   "memory": "counted by the runtime (runtime/observation/memory.py), per rank",
                   "utilisation": how})

    if per_sample_s is not None:
        if len(per_sample_s) != run.stages:
            raise ValueError(f"per_sample_s has {len(per_sample_s)} values; give one per rank "
                             f"({run.stages})")
        samples = run.batch_size * run.pipelines
        busy = profile(None, "busy share").ranks
        levels = [work_levels(w * samples / r.compute_s if r.compute_s > 0 else 1.0)
                  for w, r in zip(per_sample_s, busy)]
        how = "busy share; per-sample work (level 1) from the profiler, the rest level 0"
    else:
        how = "busy share" + ("" if levels is None else ", calibrated levels")
    return replace(profile(levels, how), iteration_s=run.median_s)


def _seq_len(model: str, dataset: str | None) -> int | None:
    from ..data import SEQUENCE_DATASETS
    from ..models import default_seq_len

    return default_seq_len(model) if dataset in SEQUENCE_DATASETS else None


def _per_rank_max(log: Sequence[dict[str, Any]], key: str) -> tuple[float, ...]:
    rows = [entry[key] for entry in log]
    return tuple(max(values) for values in zip(*rows))


def _message_bytes(sent: Sequence[float], messages: int) -> tuple[float, ...]:
    """One message's bytes across each boundary from the bytes each rank sent.

    Rank ``k`` sends activations across boundary ``k`` and gradients (the same shape) across
    boundary ``k - 1``, ``messages`` of each: ``sent[0] = messages a_0``, ``sent[k] =
    messages (a_{k-1} + a_k)``. Solved from the first rank down (shape headers are negligible).
    """
    out: list[float] = []
    for k in range(len(sent) - 1):
        share = sent[k] / messages - (out[-1] if out else 0.0)
        out.append(max(share, 0.0))
    return tuple(out)
