"""Benchmark: AvgPipe's profiling-based tuner against traversal (avgpipe.txt §5.2, §7.3).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_tuner.py
        [--quick] [--json-out benchmarks/results/avgpipe_tuner.json]

For the built-in ``gpt-tiny`` and ``cnn`` on 2 and 4 ranks, a batch of 16 samples, the grid
M in {1, 2, 4, 8, 16} x N in {1, ..., 6}, two links (this machine's loopback and a 1 Gbit/s
Ethernet like the paper's cluster) and three memory limits (none, and two that bind):

* **measured side = the simulator.** This two-core machine cannot run 4 ranks x N parallel
  pipelines for real per setting (and the runtime does not run ``avgpipe`` with N > 1 yet),
  so a setting is "measured" by simulating ``avgpipe`` (1F1B, ``advance=0``) with per-block
  costs *measured by the profiler at that setting's micro-batch size* (one thread per rank;
  every block's fastest of 15 single runs, which filters out the other processes sharing the
  machine: with medians the cost curve changed shape from run to run). The measurements are
  kept in ``benchmarks/results/avgpipe_tuner_profiles.json`` and reused (``--remeasure``
  takes them again), so the accuracy numbers do not depend on the machine's load today. Memory per rank = reference model + N x (weights, gradients, Adam state) +
  the simulator's peak activation bytes.
* **tuner**: profiles ONE setting (the profiled run is simulated from the profile at its
  micro-batch size) and predicts the grid with Equations 1-8 (``mode="interleaved"``,
  ``memory="held"``), profiled where the paper says (the largest M, the smallest N); the
  utilisation is the busy share of the timeline, a rank's compute time split into per-sample
  work (level 1) and fixed per-call overhead (level 0) by the profiler's times at the profiled
  and at the largest micro-batch size (``calibrate_levels``).
* **traversal**: evaluates every setting the same way and takes the best.

Accuracy (is the pick within 10 % of the traversal's best time per batch, and does it fit?)
uses one shared set of measurements, so measurement noise cannot decide it. Cost is timed
separately, from scratch: the tuner profiles its setting (and the calibration size) and
predicts; the traversal profiles and simulates every setting. Also reported: the paper's
accounting, where each setting costs a short real run (10 iterations per traversal setting,
20 for the tuner's profile, §5.2.1 and §5.1), from the simulated iteration times.

Ablations (same measurements): other profiling points, one calibrated level instead of the
work split, plain busy share (level 1), the paper's concurrent-process reading of N, and
Equation 8 without the held-micro-batch correction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeweave.avgpipe import TraversalResult, predict, traverse, tune
from pipeweave.avgpipe.simulated import SimulatedModel, calibrate_levels
from pipeweave.avgpipe.sources import builtin_model, profile_cache
from pipeweave.planner.evaluate import Network
from pipeweave.profiler import Profile

# -- settings ----------------------------------------------------------------------------------
MODELS = ("gpt-tiny", "cnn")
RANKS = (2, 4)
BATCH = 16
M_GRID = (1, 2, 4, 8, 16)
N_GRID = (1, 2, 3, 4, 5, 6)
NETWORKS = {"loopback": Network(bandwidth=1.83e9),            # measure_link() on this machine
            "1GbE": Network(bandwidth=1.25e8, latency=5e-5)}  # the paper's cluster (§7)
PROFILE_AT = (max(M_GRID), min(N_GRID))   # the paper's profiling point: large M, small N
RUN_ITERATIONS = {"traversal": 10, "profile": 20}   # §5.1 "ten batches", §5.2.1 "twenty"
PROFILING = {"repeats": 1, "warmup": 1, "rounds": 15}  # the shared measurements
TIMED_PROFILING = {"repeats": 1, "warmup": 1, "rounds": 5}   # what `pipeweave tune` does
OUT = Path("benchmarks/results/avgpipe_tuner.json")
PROFILES = Path("benchmarks/results/avgpipe_tuner_profiles.json")


def variants() -> dict[str, dict[str, Any]]:
    """The tuner as configured by default, and the ablations."""
    largest, second = max(M_GRID), sorted(M_GRID)[1]
    base = {"profile_at": PROFILE_AT, "calibrate": "work", "mode": "interleaved", "memory": "held"}
    return {
        "default": base,
        "work split, 2nd-smallest M": {**base, "profile_at": (second, 1)},
        "one calibrated level, 2nd-smallest M": {**base, "profile_at": (second, 1),
                                                 "calibrate": "intensity"},
        "busy share only (levels 1)": {**base, "calibrate": None},
        "busy share only, smallest M": {**base, "profile_at": (min(M_GRID), 1), "calibrate": None},
        "concurrent pipelines (paper's N)": {**base, "mode": "concurrent"},
        "Equation 8 literal": {**base, "memory": "paper"},
    }


def binding_limits(memories: Sequence[float], gap: float = 0.05) -> list[float]:
    """Two memory limits that exclude part of the grid, each halfway between two measured
    peaks at least ``gap`` apart (never at one, so a small prediction error in memory cannot
    flip a setting's feasibility: that would test the limit, not the tuner)."""
    levels: list[float] = []
    for value in sorted(memories):
        if not levels or value > levels[-1] * (1 + gap):
            levels.append(value)
    limits = []
    for q in (3, 6):
        i = max(1, len(levels) // q)
        limits.append((levels[i - 1] * (1 + gap) + levels[i]) / 2)
    return limits


def tuner_profile(sm: SimulatedModel, profile_at: tuple[int, int], calibrate: str | None) -> Any:
    m, n = profile_at
    levels = None
    if calibrate is not None:
        levels = calibrate_levels(sm.profile_at(BATCH // m), sm.profile_at(BATCH // min(M_GRID)),
                                  sm.bounds, how=calibrate)
    return sm.tuning_profile(m, n, levels=levels)


def evaluate(sm: SimulatedModel, truth: TraversalResult, limit: float | None,
             config: dict[str, Any]) -> dict[str, Any]:
    profile = tuner_profile(sm, config["profile_at"], config["calibrate"])
    result = tune(profile, M_GRID, N_GRID, memory_limit=limit, mode=config["mode"],
                  memory=config["memory"])
    best = traverse(truth.find, M_GRID, N_GRID, memory_limit=limit).best
    pick = result.best
    assert best is not None and pick is not None
    measured = truth.find(pick.microbatches, pick.pipelines)
    fits = limit is None or measured.memory_bytes <= limit
    return {"pick": [pick.microbatches, pick.pipelines], "best": [best.microbatches, best.pipelines],
            "pick_batch_s": measured.batch_s, "best_batch_s": best.batch_s,
            "ratio": measured.batch_s / best.batch_s, "pick_fits": fits,
            "within_10pct": fits and measured.batch_s <= 1.10 * best.batch_s,
            "profile": profile, "tune": result}


def table(sm: SimulatedModel, truth: TraversalResult, profile: Any) -> list[dict[str, Any]]:
    rows = []
    for x in truth.measurements:
        p = predict(profile, x.microbatches, x.pipelines)
        rows.append({"M": x.microbatches, "N": x.pipelines,
                     "predicted_batch_ms": 1e3 * p.batch_s, "measured_batch_ms": 1e3 * x.batch_s,
                     "time_error": p.batch_s / x.batch_s - 1,
                     "predicted_memory_mb": p.memory_bytes / 1e6,
                     "measured_memory_mb": x.memory_bytes / 1e6,
                     "memory_error": p.memory_bytes / x.memory_bytes - 1,
                     "afab_batch_ms": 1e3 * x.extra["afab_iteration_s"] / x.pipelines})
    return rows


def timed_costs(model: str, stages: int, network: Network, truth: TraversalResult,
                startup_s: float | None) -> dict[str, float | None]:
    """Tuner and traversal from scratch (fresh profiles, nothing cached), in wall time; and
    in the paper's accounting, where a setting costs a short real run: ``startup_s`` (one
    launch of local processes, measured) plus 10 iterations per traversal setting, and 20
    plus the calibration for the tuner."""
    fresh = profile_cache(model, cache=False, **TIMED_PROFILING)
    sm = builtin_model(model, stages=stages, batch_size=BATCH, network=network, profile_at=fresh)
    m, n = PROFILE_AT
    started = time.perf_counter()
    reference = fresh(BATCH // min(M_GRID))
    calibration_s = time.perf_counter() - started
    profiled = fresh(BATCH // m)
    levels = calibrate_levels(profiled, reference, sm.bounds)
    sm.profile_at = lambda size: profiled  # the profiled size, measured just above
    tune(sm.tuning_profile(m, n, levels=levels), M_GRID, N_GRID)
    tuner_s = time.perf_counter() - started
    sm.profile_at = fresh
    started = time.perf_counter()
    traverse(lambda mm, nn: _simulated(sm, mm, nn), M_GRID, N_GRID)
    traversal_s = time.perf_counter() - started
    out: dict[str, float | None] = {
        "tuner_s": tuner_s, "calibration_s": calibration_s, "traversal_s": traversal_s,
        "speedup": traversal_s / tuner_s, "settings": len(truth.measurements),
        "startup_s": startup_s, "run_equivalent_tuner_s": None,
        "run_equivalent_traversal_s": None, "run_equivalent_speedup": None}
    if startup_s is not None:
        runs = sum(startup_s + RUN_ITERATIONS["traversal"] * x.iteration_s for x in truth.measurements)
        profile_run = (startup_s + RUN_ITERATIONS["profile"] * truth.find(m, n).iteration_s
                       + calibration_s)
        out.update(run_equivalent_tuner_s=profile_run, run_equivalent_traversal_s=runs,
                   run_equivalent_speedup=runs / profile_run)
    return out


def real_run(model: str, stages: int, truth: TraversalResult) -> dict[str, float]:
    """One real launch of the profiled setting (N = 1, ``1f1b``): its start-up cost, and the
    measured against the simulated iteration time."""
    from pipeweave.avgpipe.sources import measure_run

    m, _ = PROFILE_AT
    steps = 4
    started = time.perf_counter()
    run = measure_run(model, stages=stages, microbatches=m, batch_size=BATCH, steps=steps)
    wall = time.perf_counter() - started
    measured = run.profile.iteration_s
    return {"wall_s": wall, "steps": steps, "startup_s": max(wall - steps * measured, 0.0),
            "measured_iteration_s": measured,
            "simulated_iteration_s": truth.find(m, 1).iteration_s,
            "peak_rss_mb": run.measurement.memory_bytes / 1e6}


def _simulated(sm: SimulatedModel, m: int, n: int) -> Any:
    from pipeweave.avgpipe import Measurement

    profile, result = sm.run(m, n)
    return Measurement(m, n, result.iteration_time, max(sm.memory(profile, result, n)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model, 2 ranks, loopback only")
    parser.add_argument("--no-real-run", action="store_true",
                        help="skip the one real launch per model and rank count (start-up cost)")
    parser.add_argument("--remeasure", action="store_true",
                        help=f"profile every micro-batch size again instead of reading {PROFILES}")
    parser.add_argument("--json-out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    stored = load_profiles(args.remeasure)
    models = MODELS[:1] if args.quick else MODELS
    ranks = RANKS[:1] if args.quick else RANKS
    networks = dict(list(NETWORKS.items())[:1]) if args.quick else NETWORKS
    cases, summary = [], {name: [] for name in variants()}
    real: dict[tuple[str, int], dict[str, float]] = {}
    for model in models:
        shared = stored_profiles(stored, model)
        for stages in ranks:
            for net_name, network in networks.items():
                sm = builtin_model(model, stages=stages, batch_size=BATCH, network=network,
                                   profile_at=shared)
                truth = traverse(sm.measure, M_GRID, N_GRID)
                if (model, stages) not in real and not (args.quick or args.no_real_run):
                    real[(model, stages)] = real_run(model, stages, truth)
                launch = real.get((model, stages))
                limits: list[float | None] = [None, *binding_limits([x.memory_bytes for x in truth.measurements])]
                case: dict[str, Any] = {"model": model, "ranks": stages, "network": net_name,
                                        "real_run": launch,
                                        "cost": timed_costs(model, stages, network, truth,
                                                            launch and launch["startup_s"]),
                                        "limits": []}
                for limit in limits:
                    entry: dict[str, Any] = {"memory_limit_mb": None if limit is None else limit / 1e6}
                    for name, config in variants().items():
                        outcome = evaluate(sm, truth, limit, config)
                        summary[name].append(outcome)
                        entry[name] = {k: outcome[k] for k in ("pick", "best", "ratio", "pick_fits",
                                                                "within_10pct")}
                        if name == "default":
                            profile = outcome["profile"]
                    case["limits"].append(entry)
                case["settings"] = table(sm, truth, profile)
                cases.append(case)
                print(_case_line(case))
    report = {"grid": {"M": list(M_GRID), "N": list(N_GRID), "batch": BATCH},
              "profile_at": list(PROFILE_AT), "measured_side": "simulator with profiled costs",
              "cases": cases, "variants": {name: _aggregate(outcomes) for name, outcomes in summary.items()}}
    for name, agg in report["variants"].items():
        print(f"{name:<36} within 10 %: {agg['within_10pct']}/{agg['cases']}  worst "
              f"{agg['worst_ratio']:.3f}  mean {agg['mean_ratio']:.3f}  infeasible picks {agg['infeasible']}")
    costs = [c["cost"] for c in cases]
    print(f"tuning vs traversal wall time (simulator as measurement): median speedup "
          f"{statistics.median(c['speedup'] for c in costs):.1f}x (min {min(c['speedup'] for c in costs):.1f}x)")
    runs = [c["run_equivalent_speedup"] for c in costs if c["run_equivalent_speedup"] is not None]
    if runs:
        print(f"in short real runs (measured start-up + 10 iterations per setting vs 20 + "
              f"calibration): median {statistics.median(runs):.1f}x (min {min(runs):.1f}x)")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2, default=_jsonable) + "\n")
    if args.remeasure or not PROFILES.exists():
        PROFILES.write_text(json.dumps({f"{m}/{b}": p.to_json() for (m, b), p in stored.items()},
                                       indent=1) + "\n")
    print(f"wrote {args.json_out}")
    return 0


def load_profiles(remeasure: bool) -> dict[tuple[str, int], Profile]:
    if remeasure or not PROFILES.exists():
        return {}
    data = json.loads(PROFILES.read_text())
    return {(key.split("/")[0], int(key.split("/")[1])): Profile.from_json(value)
            for key, value in data.items()}


def stored_profiles(stored: dict[tuple[str, int], Profile], model: str) -> Any:
    """``size -> profile`` from ``stored``, measuring (and storing) what is missing."""
    measure = profile_cache(model, **PROFILING)

    def profile_at(size: int) -> Profile:
        if (model, size) not in stored:
            stored[(model, size)] = measure(size)
        return stored[(model, size)]

    return profile_at


def _case_line(case: dict[str, Any]) -> str:
    picks = " | ".join(
        f"limit {e['memory_limit_mb'] and round(e['memory_limit_mb'], 2)} MB: pick {tuple(e['default']['pick'])} "
        f"best {tuple(e['default']['best'])} x{e['default']['ratio']:.3f}" for e in case["limits"])
    cost = case["cost"]
    runs = cost["run_equivalent_speedup"]
    return (f"{case['model']:<9} P={case['ranks']} {case['network']:<8} {picks} | tuner "
            f"{cost['tuner_s']:.2f}s traversal {cost['traversal_s']:.2f}s ({cost['speedup']:.1f}x"
            + (f"; real runs {runs:.1f}x)" if runs is not None else ")"))


def _aggregate(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [o["ratio"] for o in outcomes]
    return {"cases": len(outcomes), "within_10pct": sum(o["within_10pct"] for o in outcomes),
            "infeasible": sum(not o["pick_fits"] for o in outcomes),
            "worst_ratio": max(ratios), "mean_ratio": statistics.mean(ratios)}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    return str(value)


if __name__ == "__main__":
    raise SystemExit(main())
