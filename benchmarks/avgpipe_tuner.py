"""Benchmark: AvgPipe's profiling-based tuner against traversal, on real runs (avgpipe.txt §5.2, §7.3).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_tuner.py
        [--models gpt-tiny cnn] [--ranks 2 4] [--json-out benchmarks/results/avgpipe_tuner.json]

For the built-in ``gpt-tiny`` and ``cnn``, a batch of 16 samples per pipeline and the grid
M x N below, on ``--ranks`` local processes (gloo over loopback, one intra-op thread each):

* **traversal** (§5.1): every setting is a short real run of ``avgpipe`` (advance 0, i.e.
  1F1B; N co-partitioned parallel pipelines) with :func:`pipeweave.measure.run_setting`:
  one warm-up iteration and ten timed ones; its time is the median iteration (the slowest
  rank's, as the runtime measures it), its memory the runtime's counted peak per rank (model
  state + activations, ``runtime/observation/memory.py``), the largest rank's. Cost: the sum of the runs'
  wall times, launch included.
* **tuner** (§5.2), from scratch: the profiler times the model at the profiled and at the
  smallest M's micro-batch size (what ``calibrate_levels`` needs to split a rank's compute
  into per-sample work and per-call overhead, the CPU's utilisation levels), ONE real run of
  the profiled setting (the paper's choice: the largest M, the smallest N; the same run
  length as a traversal's), its profile (``profile_real_run``), and Equations 1-8 over the
  grid (``mode="interleaved"``, ``memory="held"``). Cost: all of that, in wall time.
* **accuracy**: for each memory limit (none, and two that bind, set between measured peaks),
  the tuner's pick against the traversal's best, both read from the traversal's measurements
  (so the pick is judged by what it really does): ratio of measured time per batch, and
  whether the pick really fits.
* **ablations**, on the same runs: the utilisation as one calibrated level or as the plain
  busy share, the paper's concurrent reading of N, Equation 8 without the held-micro-batch
  correction, other profiled settings (the traversal's run of that setting as the profile).

With 4 ranks the 4 processes share this machine's 2 cores (oversubscribed: a rank's bubble
is another rank's compute time), which Equations 1-8 do not model; such results are labelled.
A throw-away launch first starts the process server, so neither side pays for it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine_load import wait_for_quiet
from pipeweave.avgpipe import TraversalResult, TuningProfile, predict, traverse, tune
from pipeweave.avgpipe.simulated import calibrate_levels, per_sample_seconds
from pipeweave.measure import (LOOPBACK_BANDWIDTH, RealRun, builtin_model, profile_cache,
                               profile_real_run, run_setting)
from pipeweave.planner.evaluate import Network
from pipeweave.profiler import Profile

# -- settings ----------------------------------------------------------------------------------
MODELS = ("gpt-tiny", "cnn")
RANKS = (2, 4)
BATCH = 16
M_GRID = (1, 2, 4, 8, 16)
N_GRID = (1, 2, 3, 4, 5, 6)
WARMUP, ITERATIONS = 1, 10                 # §5.1: "a small number of batches (e.g., ten)"
PROFILE_AT = (max(M_GRID), min(N_GRID))    # §5.2.1: "a rather large M and a small N"
PROFILER = {"repeats": 1, "warmup": 1, "rounds": 5}   # what `pipeweave tune` does
NETWORK = Network(bandwidth=LOOPBACK_BANDWIDTH)
OUT = Path("benchmarks/results/avgpipe_tuner.json")


def variants() -> dict[str, dict[str, Any]]:
    """The tuner as configured by default, and the ablations (same runs, other readings)."""
    base = {"profile_at": PROFILE_AT, "calibrate": "work", "mode": "interleaved", "memory": "held"}
    second = sorted(M_GRID)[-2]
    return {
        "default": base,
        "one calibrated level": {**base, "calibrate": "intensity"},
        "busy share only (level 1)": {**base, "calibrate": None},
        "concurrent pipelines (paper's N)": {**base, "mode": "concurrent"},
        "Equation 8 literal": {**base, "memory": "paper"},
        f"profiled at M={second}, N={min(N_GRID)}": {**base, "profile_at": (second, min(N_GRID))},
        f"profiled at M={second}, N={max(N_GRID)}": {**base, "profile_at": (second, max(N_GRID))},
    }


def binding_limits(memories: Sequence[float], gap: float = 0.05) -> list[float]:
    """Two memory limits that exclude part of the grid, each halfway between two measured
    peaks at least ``gap`` apart (never at one, so a small error in the predicted memory
    cannot flip a setting's feasibility: that would test the limit, not the tuner)."""
    levels: list[float] = []
    for value in sorted(memories):
        if not levels or value > levels[-1] * (1 + gap):
            levels.append(value)
    limits: list[float] = []
    for q in (3, 6):
        i = max(1, len(levels) // q)
        if i < len(levels):
            limit = (levels[i - 1] * (1 + gap) + levels[i]) / 2
            limits += [] if limit in limits else [limit]
    return limits


class Calibration:
    """Profiler times per micro-batch size (``calibrate_levels``' input), remembered."""

    def __init__(self, model: str, stages: int) -> None:
        self.measure = profile_cache(model, cache=False, **PROFILER)
        self.bounds = builtin_model(model, stages=stages, batch_size=BATCH,
                                    profile_at=self.measure).bounds
        self.profiles: dict[int, Profile] = {}

    def at(self, size: int) -> Profile:
        if size not in self.profiles:
            self.profiles[size] = self.measure(size)
        return self.profiles[size]

    def utilisation(self, microbatches: int, how: str | None) -> dict[str, Any]:
        """``profile_real_run``'s utilisation arguments, as ``pipeweave tune`` passes them."""
        if how is None or microbatches == min(M_GRID):
            return {}
        mine, reference = self.at(BATCH // microbatches), self.at(BATCH // min(M_GRID))
        if how == "work":
            return {"per_sample_s": per_sample_seconds(mine, reference, self.bounds)}
        return {"levels": calibrate_levels(mine, reference, self.bounds, how=how)}


QUIET = {"busy": 0.25, "wait_s": 10.0}   # start a run once others use < 25 % of the CPUs
BUSY_BEFORE: list[dict[str, Any]] = []   # per run: the setting and the others' CPU share


def run(model: str, stages: int, m: int, n: int) -> RealRun:
    """One setting, started when the machine is quiet (waiting is not charged to anyone:
    costs are the runs' own wall times)."""
    busy = wait_for_quiet(QUIET["wait_s"], QUIET["busy"], sample_s=0.5)
    BUSY_BEFORE.append({"model": model, "ranks": stages, "M": m, "N": n, "busy_before": busy})
    return run_setting(model, stages=stages, microbatches=m, pipelines=n, batch_size=BATCH,
                       warmup=WARMUP, iterations=ITERATIONS, timeout_s=300.0)


def tuner_from_scratch(model: str, stages: int) -> dict[str, Any]:
    """The tuner as a user runs it, timed: calibration, one real run, profile, predictions."""
    started = time.perf_counter()
    calibration = Calibration(model, stages)
    utilisation = calibration.utilisation(PROFILE_AT[0], "work")
    calibration_s = time.perf_counter() - started
    profiled = run(model, stages, *PROFILE_AT)
    started = time.perf_counter()
    profile = profile_real_run(profiled, network=NETWORK, **utilisation)
    tune(profile, M_GRID, N_GRID)
    predict_s = time.perf_counter() - started
    return {"seconds": calibration_s + profiled.wall_s + predict_s, "calibration_s": calibration_s,
            "run_wall_s": profiled.wall_s, "predict_s": predict_s, "run": profiled,
            "profile": profile, "calibration": calibration}


def traversal_runs(model: str, stages: int) -> tuple[dict[tuple[int, int], RealRun], float]:
    """Every setting run for real; the cost is the sum of the runs' wall times."""
    runs = {}
    for m in M_GRID:
        for n in N_GRID:
            runs[(m, n)] = run(model, stages, m, n)
            print(f"  measured {model} P={stages} M={m} N={n}: "
                  f"{1e3 * runs[(m, n)].median_s / n:.2f} ms/batch, "
                  f"{max(runs[(m, n)].peak_bytes) / 1e6:.3f} MB", flush=True)
    return runs, sum(r.wall_s for r in runs.values())


def variant_profile(config: dict[str, Any], tuner: dict[str, Any],
                    runs: dict[tuple[int, int], RealRun]) -> TuningProfile:
    at = tuple(config["profile_at"])
    source = tuner["run"] if at == PROFILE_AT else runs[at]
    utilisation = tuner["calibration"].utilisation(at[0], config["calibrate"])
    return profile_real_run(source, network=NETWORK, **utilisation)


def evaluate(profile: TuningProfile, truth: TraversalResult, limit: float | None,
             config: dict[str, Any]) -> dict[str, Any]:
    result = tune(profile, M_GRID, N_GRID, memory_limit=limit, mode=config["mode"],
                  memory=config["memory"])
    best = traverse(truth.find, M_GRID, N_GRID, memory_limit=limit).best
    pick = result.best
    assert best is not None and pick is not None
    measured = truth.find(pick.microbatches, pick.pipelines)
    fits = limit is None or measured.memory_bytes <= limit
    return {"pick": [pick.microbatches, pick.pipelines], "best": [best.microbatches, best.pipelines],
            "pick_batch_ms": 1e3 * measured.batch_s, "best_batch_ms": 1e3 * best.batch_s,
            "ratio": measured.batch_s / best.batch_s, "pick_fits": fits,
            "within_10pct": fits and measured.batch_s <= 1.10 * best.batch_s}


def table(profile: TuningProfile, truth: TraversalResult,
          limits: Sequence[float]) -> list[dict[str, Any]]:
    rows = []
    for x in truth.measurements:
        p = predict(profile, x.microbatches, x.pipelines)
        rows.append({"M": x.microbatches, "N": x.pipelines,
                     "predicted_batch_ms": 1e3 * p.batch_s, "measured_batch_ms": 1e3 * x.batch_s,
                     "time_error": p.batch_s / x.batch_s - 1,
                     "predicted_memory_mb": p.memory_bytes / 1e6,
                     "measured_memory_mb": x.memory_bytes / 1e6,
                     "memory_error": p.memory_bytes / x.memory_bytes - 1,
                     "measured_memory_per_rank_mb": [b / 1e6 for b in x.extra["memory_per_rank"]],
                     "peak_rss_mb": max(x.extra["rss_per_rank"]) / 1e6,
                     "iterations_ms": [1e3 * s for s in x.extra["iterations_s"]],
                     "run_wall_s": x.extra["wall_s"],
                     "fits": [x.memory_bytes <= limit for limit in limits],
                     "predicted_fits": [p.memory_bytes <= limit for limit in limits]})
    return rows


def run_case(model: str, stages: int) -> dict[str, Any]:
    runs, traversal_s = traversal_runs(model, stages)
    tuner = tuner_from_scratch(model, stages)
    truth = TraversalResult(tuple(r.measurement() for r in runs.values()), None, None, traversal_s)
    limits = binding_limits([x.memory_bytes for x in truth.measurements])
    entries = []
    for limit in [None, *limits]:
        entry: dict[str, Any] = {"memory_limit_mb": None if limit is None else limit / 1e6}
        for name, config in variants().items():
            entry[name] = evaluate(variant_profile(config, tuner, runs), truth, limit, config)
        entries.append(entry)
    again = tuner["run"].median_s / runs[PROFILE_AT].median_s - 1
    # what the traversal would have cost on smaller grids (N up to n_max), same tuner cost
    by_grid = [{"N_max": n_max, "settings": sum(1 for (_, n) in runs if n <= n_max),
                "traversal_s": sum(r.wall_s for (_, n), r in runs.items() if n <= n_max)}
               for n_max in N_GRID]
    for row in by_grid:
        row["speedup"] = row["traversal_s"] / tuner["seconds"]
    return {
        "model": model, "ranks": stages, "oversubscribed": stages > 2,
        "cost": {"tuner_s": tuner["seconds"], "calibration_s": tuner["calibration_s"],
                 "tuner_run_wall_s": tuner["run_wall_s"], "predict_s": tuner["predict_s"],
                 "traversal_s": traversal_s,
                 "speedup": traversal_s / tuner["seconds"], "settings": len(runs),
                 "by_grid": by_grid},
        "profile_repeat_error": again, "limits": entries,
        "settings": table(tuner["profile"], truth, limits),
        "profile": tuner["profile"].to_json(),
    }


def print_case(case: dict[str, Any]) -> None:
    cost = case["cost"]
    label = " (4 processes on 2 cores: oversubscribed)" if case["oversubscribed"] else ""
    limits = [e["memory_limit_mb"] for e in case["limits"][1:]]
    print(f"\n{case['model']} on {case['ranks']} ranks{label}; batch {BATCH}, profiled "
          f"M={PROFILE_AT[0]}, N={PROFILE_AT[1]}; limits {', '.join(f'{x:.3f}' for x in limits)} MB")
    print(f"{'M':>3} {'N':>2} {'pred ms/b':>10} {'meas ms/b':>10} {'err':>6} "
          f"{'pred MB':>8} {'meas MB':>8} {'err':>6}")
    for r in case["settings"]:
        print(f"{r['M']:>3} {r['N']:>2} {r['predicted_batch_ms']:>10.2f} {r['measured_batch_ms']:>10.2f} "
              f"{100 * r['time_error']:>5.0f}% {r['predicted_memory_mb']:>8.3f} "
              f"{r['measured_memory_mb']:>8.3f} {100 * r['memory_error']:>5.1f}%")
    for e in case["limits"]:
        d = e["default"]
        limit = "none" if e["memory_limit_mb"] is None else f"{e['memory_limit_mb']:.3f} MB"
        print(f"limit {limit:>9}: tuner picks {tuple(d['pick'])} ({d['pick_batch_ms']:.2f} ms/batch"
              f"{'' if d['pick_fits'] else ', DOES NOT FIT'}), traversal's best {tuple(d['best'])} "
              f"({d['best_batch_ms']:.2f}): x{d['ratio']:.3f}")
    print(f"tuning {cost['tuner_s']:.1f} s (calibration {cost['calibration_s']:.1f} s, run "
          f"{cost['tuner_run_wall_s']:.1f} s) vs traversal {cost['traversal_s']:.1f} s "
          f"({cost['settings']} runs): {cost['speedup']:.1f}x less")


def main(argv: list[str] | None = None) -> int:
    global M_GRID, N_GRID, PROFILE_AT, ITERATIONS  # the settings above, for a smaller run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--ranks", nargs="+", type=int, default=list(RANKS))
    parser.add_argument("--m-grid", type=int, nargs="+", default=list(M_GRID))
    parser.add_argument("--n-grid", type=int, nargs="+", default=list(N_GRID))
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="timed per run")
    parser.add_argument("--quiet-wait", type=float, default=QUIET["wait_s"],
                        help="seconds to wait, at most, for other processes to go quiet before a run")
    parser.add_argument("--json-out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    M_GRID, N_GRID = tuple(sorted(args.m_grid)), tuple(sorted(args.n_grid))
    PROFILE_AT, ITERATIONS = (max(M_GRID), min(N_GRID)), args.iterations
    QUIET["wait_s"] = args.quiet_wait
    started = time.perf_counter()
    run_setting("mlp", stages=2, microbatches=1, batch_size=4, iterations=1)  # start the server
    cases: list[dict[str, Any]] = []
    for model in args.models:
        for stages in args.ranks:
            cases.append(run_case(model, stages))
            print_case(cases[-1])
            report = write_report(args.json_out, cases, time.perf_counter() - started)
    print()
    for name, agg in report["variants"].items():
        print(f"{name:<34} within 10 %: {agg['within_10pct']}/{agg['cases']}  worst "
              f"x{agg['worst_ratio']:.3f}  mean x{agg['mean_ratio']:.3f}  infeasible picks "
              f"{agg['infeasible']}")
    speedups = [c["cost"]["speedup"] for c in cases]
    print(f"tuning vs traversal: min {min(speedups):.1f}x, median {statistics.median(speedups):.1f}x")
    print(f"wrote {args.json_out} ({report['elapsed_s']:.0f} s)")
    return 0


def write_report(path: Path, cases: list[dict[str, Any]], elapsed_s: float) -> dict[str, Any]:
    """The results so far (written after every case, so a long run keeps what it measured)."""
    summary = {name: _aggregate([e[name] for c in cases for e in c["limits"]]) for name in variants()}
    report = {"grid": {"M": list(M_GRID), "N": list(N_GRID), "batch": BATCH},
              "profile_at": list(PROFILE_AT), "warmup": WARMUP, "iterations": ITERATIONS,
              "measured_side": "real runs (launch_local, gloo), counted memory",
              "elapsed_s": elapsed_s, "runs_busy_before": BUSY_BEFORE, "cases": cases,
              "variants": summary}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return report


def _aggregate(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [o["ratio"] for o in outcomes]
    return {"cases": len(outcomes), "within_10pct": sum(o["within_10pct"] for o in outcomes),
            "infeasible": sum(not o["pick_fits"] for o in outcomes),
            "worst_ratio": max(ratios), "mean_ratio": statistics.mean(ratios)}


if __name__ == "__main__":
    raise SystemExit(main())
