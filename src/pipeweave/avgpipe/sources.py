"""Where the tuner's numbers come from for a built-in model: the simulator fed with measured
per-block costs, or a short real run on local processes.

* :func:`builtin_model` — a :class:`~pipeweave.avgpipe.simulated.SimulatedModel` whose costs at
  micro-batch size ``b`` are :func:`pipeweave.profiler.profile_builtin` measured at ``b`` (one
  intra-op thread, what a rank gets on this two-core machine), split uniformly into stages
  like ``pipeweave train`` does.
* :func:`measure_run` — run ``steps`` iterations of a setting for real with
  :func:`pipeweave.runtime.launch_local` and profile its timeline (``1f1b`` for ``N = 1``;
  ``avgpipe`` for ``N > 1`` once the runtime runs it) and its peak memory.

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..planner.evaluate import Network
from ..planner.partition import uniform_partition
from ..profiler.profile import Profile
from .profile import Levels, TuningProfile, profile_from_timeline
from .simulated import SimulatedModel
from .tuner import Measurement, held_microbatches

__all__ = ["builtin_model", "profile_cache", "measure_run", "RunProfile"]


def profile_cache(model: str, *, repeats: int = 1, warmup: int = 1, rounds: int = 5,
                  threads: int = 1, seed: int = 0, cache: bool = True) -> Callable[[int], Profile]:
    """``micro-batch size -> profile_builtin(model)`` at that size; remembered when ``cache``.

    The model is profiled ``rounds`` times and every block keeps its fastest forward and
    backward: on a shared machine the minimum filters out the time other processes took (as
    latency benchmarks do; medians of a loaded two-core machine changed the shape of the cost
    curve from one run to the next).
    """
    from ..profiler import profile_builtin

    remembered: dict[int, Profile] = {}

    def profile_at(size: int) -> Profile:
        if cache and size in remembered:
            return remembered[size]
        runs = [profile_builtin(model, batch_size=size, repeats=repeats, warmup=warmup,
                                threads=threads, seed=seed) for _ in range(rounds)]
        profile = replace(runs[0], blocks=tuple(
            replace(block, forward=min(r.blocks[i].forward for r in runs),
                    backward=min(r.blocks[i].backward for r in runs))
            for i, block in enumerate(runs[0].blocks)))
        if cache:
            remembered[size] = profile
        return profile

    return profile_at


def builtin_model(model: str, *, stages: int, batch_size: int, network: Network | None = None,
                  profile_at: Callable[[int], Profile] | None = None,
                  iterations: int = 2) -> SimulatedModel:
    """A built-in model split uniformly into ``stages``, simulated from measured costs."""
    profile_at = profile_at if profile_at is not None else profile_cache(model)
    bounds = uniform_partition(_num_blocks(model), stages)
    return SimulatedModel(profile_at=profile_at, bounds=bounds, batch_size=batch_size,
                          network=network if network is not None else Network(),
                          iterations=iterations)


def _num_blocks(model: str) -> int:
    from ..models import build_model

    return len(build_model(model).blocks)


@dataclass(frozen=True)
class RunProfile:
    """A real run's profile and measurement of one setting."""

    profile: TuningProfile
    measurement: Measurement


def measure_run(model: str, *, stages: int, microbatches: int, pipelines: int = 1,
                batch_size: int, steps: int = 6, network: Network | None = None,
                levels: Sequence[Levels] | None = None, timeout_s: float = 120.0,
                seed: int = 0) -> RunProfile:
    """Run one setting on ``stages`` local processes and profile it (§5.2.1 on real ranks).

    Iteration 0 (start-up) is left out of the window. Memory per rank is the peak resident
    set (CPU) or ``max_memory_allocated`` (GPU). A process's peak cannot be split by
    measurement, so ``F_dat`` is the profiler's stash per micro-batch times what 1F1B holds,
    ``F_mod`` the models, and the rest of the peak (the torch runtime, the reference model)
    is ``fixed``.
    """
    from ..models.gpt import GPT_PRESETS
    from ..runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local
    from ..runtime.summary import iteration_end_times

    if steps < 3:
        raise ValueError(f"a measured profile needs steps >= 3 (the first is left out), got {steps}")
    spec = BuiltinModel(model, seed=seed)()
    plan = Plan.uniform(len(spec.blocks), stages, schedule="1f1b" if pipelines == 1 else "avgpipe",
                        microbatches=microbatches, pipelines=pipelines)
    dataset = spec.dataset or "digits"
    seq_len = GPT_PRESETS[model].seq_len if dataset == "stdlib-bytes" and model in GPT_PRESETS else None
    job = Job(plan=plan, steps=steps, model=BuiltinModel(model, seed=seed),
              data=BuiltinData(dataset, batch_size=batch_size, seq_len=seq_len, seed=seed),
              optimizer=OptimizerFactory("adam", {"lr": 1e-3}), seed=seed, timeout_s=timeout_s)
    results = launch_local(job, deadline_s=timeout_s * 2)
    records = [r for result in results for r in result.records]
    ends = iteration_end_times(records, microbatches, steps)
    window = (ends[0], ends[-1])
    sim_model = builtin_model(model, stages=stages, batch_size=batch_size, network=network)
    profile = sim_model.profile_at(batch_size // microbatches)
    costs = sim_model.costs(profile).resolve(stages)
    reference = sim_model.reference_bytes(profile)
    models = sim_model.model_bytes(profile, pipelines)
    # F_dat: what the schedule holds (1F1B: min(P - k, M) micro-batches per pipeline) of the
    # profiler's stash per micro-batch; the rest of the measured peak is fixed (the runtime)
    stash = sim_model.stash_bytes(profile)
    data = [pipelines * held_microbatches(k, stages, microbatches) * stash[k] for k in range(stages)]
    measured = [float(r.peak_memory_bytes) for r in results]
    fixed = [max(f - mod - d, ref) for f, mod, d, ref in zip(measured, models, data, reference)]
    tuning = profile_from_timeline(
        records, stages=stages, microbatches=microbatches, pipelines=pipelines,
        iterations=steps - 1, transfer_s=[costs.comm(b) for b in range(stages - 1)],
        model_bytes=models, data_bytes=data, fixed_bytes=fixed,
        window=window, levels=levels, source="measured", batch_size=batch_size,
        notes={"model": model, "steps": steps, "schedule": plan.schedule,
               "memory": "peak RSS (CPU) / max_memory_allocated (GPU); F_dat from the schedule"},
    )
    measurement = Measurement(microbatches, pipelines, tuning.iteration_s, max(measured),
                              extra=_extra(measured, results))
    return RunProfile(tuning, measurement)


def _extra(measured: list[float], results: Any) -> dict[str, Any]:
    return {"memory_per_rank": measured,
            "wall_s": max((r.wall_seconds for r in results), default=math.nan)}
