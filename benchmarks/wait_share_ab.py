"""Benchmark: the calibration's models of waiting ranks where ranks outnumber cores, judged
on the same measurements (issue 29, item 2): ``compute_per_receive`` (a fixed cost per action
that takes a message), ``wait_share`` (a waiting rank's share of a core,
:mod:`pipeweave.sim.shared_cores`), or neither.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/wait_share_ab.py \
        [--cases cnn:4 gpt-tiny:4] [--json-out benchmarks/results/wait_share_ab.json]

Per case, as ``pipeweave auto --model M --ranks R --run`` does it: the model profiled at
auto's micro-batch sizes and calibrated (link, runtime costs, all-reduce), the calibration
plans timed in alternating rounds; then the **same** rounds fitted three ways (:data:`FITS`:
the default plan at the data-parallel plan's scale, its compute fixing
``compute_per_receive`` or ``wait_share``; or the fit before, every plan its own scale);
each fit searched; the default and every fit's winner trained in alternating rounds (``--rounds`` of about
``--run-seconds``), and every measured plan predicted by both fits. Because both fits see
the same runs and the same measured plans, the load of a shared machine moves both alike:
the table compares the models, not two moments of the machine. Per plan: measured median,
each fit's prediction and error. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeweave.auto import AutoProblem, Prediction, search  # noqa: E402
from pipeweave.auto.predict import simulate_candidate  # noqa: E402
from pipeweave.auto.scaling import scaled_profile  # noqa: E402
from pipeweave.measure import (alternate, auto_microbatch_sizes, calibrate,  # noqa: E402
                               fit_calibration, local_shared_cores, plan_timer,
                               profile_model)
from pipeweave.measure import calibration_runs  # noqa: E402
from pipeweave.planner.plan import Plan  # noqa: E402


def _problem(model: str, ranks: int) -> AutoProblem:
    profiles = [profile_model(model=model, batch_size=size, ranks=ranks)
                for size in auto_microbatch_sizes(batch_size=None, ranks=ranks)]
    profile = calibrate(profiles[0], model=model)
    return AutoProblem(profile=profile, extra_profiles=tuple(profiles[1:]), ranks=ranks,
                       shared_cores=local_shared_cores(profile, ranks=ranks))


FITS = {"receive": calibration_runs.PER_RECEIVE, "wait": calibration_runs.WAIT_SHARE,
        "none": None}
"""Each fit: what the default plan's compute fixes where ranks outnumber cores
(``compute_per_receive``, this branch's default; ``wait_share``), or nothing (the fit
before: every plan its own scale)."""


def _fits(problem: AutoProblem, model: str) -> dict[str, AutoProblem]:
    """The calibration rounds run once (under the first fit), fitted every way of
    :data:`FITS`."""
    timer = plan_timer(model=model, batch_size=problem.batch)
    seen: dict[str, list[tuple[float, list[float]]]] = {}

    def recorded(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        seen.setdefault(label, []).append(timer(label, plan, steps))
        return seen[label][-1]

    out: dict[str, AutoProblem] = {}
    waiting, borrowed = calibration_runs.WAITING, calibration_runs._borrowed
    try:
        for name, fixes in FITS.items():
            if fixes is None:
                calibration_runs._borrowed = lambda problem: {}
            else:
                calibration_runs.WAITING = fixes
            replay = {label: iter(runs) for label, runs in seen.items()}
            out[name], fit = fit_calibration(
                problem, time_one=recorded if not seen else
                (lambda label, plan, steps: next(replay[label])))
            assert fit is not None
            print(f"  fitted ({name}): {fit.fitted}", flush=True)
    finally:
        calibration_runs.WAITING, calibration_runs._borrowed = waiting, borrowed
    return out


def _predicted(prediction: Prediction, problem: AutoProblem) -> float:
    candidate = prediction.candidate
    profile = scaled_profile(problem.profile, problem.batch // candidate.microbatches,
                             problem.extra_profiles)
    return simulate_candidate(candidate, profile, problem).iteration_time


def case(model: str, ranks: int, rounds: int, seconds: float) -> dict[str, Any]:
    load_before = os.getloadavg()
    problem = _problem(model, ranks)
    fits = _fits(problem, model)
    plans: dict[str, Prediction] = {}
    for name, fitted in fits.items():
        result = search(fitted)
        plans[f"winner ({name})"] = result.winner
        if result.default is not None:
            plans["default"] = result.default
    unique: dict[str, Prediction] = {}
    for label, prediction in plans.items():
        if all(other.plan != prediction.plan for other in unique.values()):
            unique[label] = prediction
    timer = plan_timer(model=model, batch_size=problem.batch)
    measured = alternate({label: (p.plan, p.iteration_time) for label, p in unique.items()},
                         rounds=rounds, seconds=seconds, steps=None,
                         time_one=lambda label, plan, steps: timer(label, plan, steps)[0])
    rows = []
    for label, prediction in unique.items():
        median = measured[label].median
        row = {"plan": label, "shape": _shape(prediction.plan), "measured": median,
               "rounds": list(measured[label].times)}
        for name, fitted in fits.items():
            predicted = _predicted(prediction, fitted)
            row[f"predicted ({name})"] = predicted
            row[f"error ({name})"] = (predicted - median) / median
        rows.append(row)
    runtime = {name: fitted.profile.runtime.to_json() for name, fitted in fits.items()
               if fitted.profile.runtime is not None}
    return {"model": model, "ranks": ranks, "rows": rows, "runtime": runtime,
            "load_before": list(load_before), "load_after": list(os.getloadavg())}


def _shape(plan: Plan) -> str:
    return (f"{plan.schedule} stages={[list(s) for s in plan.stages]} "
            f"replicas={plan.replicas} M={plan.microbatches}")


def _print(result: Mapping[str, Any]) -> None:
    print(f"{result['model']}:{result['ranks']}  load {result['load_before'][0]:.1f} -> "
          f"{result['load_after'][0]:.1f}")
    print(f"  {'plan':<18} {'measured ms':>11}"
          + "".join(f" {name + ' ms':>10} {'err':>7}" for name in FITS) + "  shape")
    for row in result["rows"]:
        print(f"  {row['plan']:<18} {1e3 * row['measured']:11.2f}"
              + "".join(f" {1e3 * row[f'predicted ({name})']:10.2f} "
                        f"{100 * row[f'error ({name})']:6.1f}%" for name in FITS)
              + f"  {row['shape']}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["cnn:4", "gpt-tiny:4"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-seconds", type=float, default=1.0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    results = []
    for text in args.cases:
        model, ranks = text.split(":")
        print(f"{model} {ranks} ranks ...", flush=True)
        results.append(case(model, int(ranks), args.rounds, args.run_seconds))
        _print(results[-1])
    errors = {name: statistics.median(abs(row[f"error ({name})"]) for r in results
                                      for row in r["rows"]) for name in FITS}
    print("median |error| over every plan measured: "
          + ", ".join(f"{name} {100 * value:.1f} %" for name, value in errors.items()))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "command": " ".join(sys.argv), "cases": results,
             "median_abs_error": errors}, indent=1))


if __name__ == "__main__":
    main()
