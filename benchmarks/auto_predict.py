"""Benchmark: how close ``pipeweave auto --model M --ranks R --run`` predicts the iteration
time of its winner and of the default plan (issue 29, item 2: within 10 %, median over three
runs), and whether the winner stays the same from run to run.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/auto_predict.py \
        [--cases gpt-tiny:2 cnn:2] [--repeats 3] [--json-out benchmarks/results/auto_predict.json]
    ... benchmarks/auto_predict.py --cases gpt-tiny:2 gpt-tiny:4 gpt-small:2 gpt-small:4 cnn:2 cnn:4
    ... benchmarks/auto_predict.py --two-profiles --cases gpt-tiny:2 cnn:2 \
        --json-out benchmarks/results/auto_two_profiles.json

Each run is the whole command, from scratch, as a user types it (a fresh profile, calibration,
search, and ``--run``: the winner and the default in ``--rounds`` alternating rounds of about
``--run-seconds`` each, median reported), ``--repeats`` times per case, one case after
another. Per run: the winner's shape, the predicted and measured (median) iteration time
and the error of each plan, the rounds' spread, the fitted calibration, the machine's load
average before and after. Per case: the median error of the winner and of the default over
the runs, the largest, and whether every run picked the same plan; per plan the busy
fraction predicted (1 - the simulated bubble) and measured (the timelines' compute over ranks
x the iteration), which says whether an error is mispriced compute or missed waits. The JSON
(``--json-out``) holds all of it.

One run of gpt-tiny or cnn at 2 ranks took 45-85 s on this 2-core machine at load 3-5
(2026-11-27: profiling two micro-batch sizes; the calibration: link, runtime costs, the
all-reduce at six sizes, 3 rounds of 2 plans; the search; 3 rounds of 2 plans and 2 memory
runs), so the two default cases x 3 runs take some 5-9 minutes. Since, ``auto`` profiles
four sizes (8, 4, 2, 1 samples) and at 4 ranks runs a third calibration plan: gpt-tiny at 2
ranks took 61 s at load 11, cnn at 4 ranks 137 s at load 9-11. gpt-small runs take longer
(its iterations are ~0.25-1 s: one ``auto`` at 4 ranks took 2:40 at load 7, without
``--run``). Read the load averages and the spreads: a loaded machine moves the times.

``--two-profiles`` (issue 29, item 2: "two profiles of the same model pick plans within 5 %
of each other when both are measured"): per case, ``pipeweave auto`` twice without
``--run`` (each profiles and calibrates afresh), then both winners trained in alternating
rounds (:func:`pipeweave.measure.alternating.alternate`, ``--rounds`` of about
``--run-seconds``); reported: each winner, its predicted and measured samples/s, and the
slower winner's measured samples/s over the faster's (``ratio``; within 5 %: >= 0.95, or
the same plan twice, whose ratio is only the machine's noise).
Some 2-3 minutes a case at 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeweave.measure import Rounds, alternate, plan_timer  # noqa: E402
from pipeweave.planner.plan import Plan  # noqa: E402

DEFAULT_CASES = ("gpt-tiny:2", "cnn:2")
SRC = Path(__file__).resolve().parents[1] / "src"


def _case(text: str) -> tuple[str, int]:
    model, _, ranks = text.partition(":")
    if not model or not ranks.isdigit() or int(ranks) < 1:
        raise argparse.ArgumentTypeError(f"case {text!r}: give MODEL:RANKS, e.g. gpt-tiny:2")
    return model, int(ranks)


def run_auto(model: str, ranks: int, *, extra: list[str], timeout_s: float) -> dict[str, Any]:
    """One ``pipeweave auto --model M --ranks R --json`` with ``extra`` arguments: its
    report, wall time and the load average before and after."""
    with tempfile.TemporaryDirectory(prefix="auto-predict-") as folder:
        command = [sys.executable, "-m", "pipeweave", "auto", "--model", model, "--ranks",
                   str(ranks), "--json", *extra, "--out", f"{folder}/plan.json", "--plot",
                   f"{folder}/p.png"]
        load_before = os.getloadavg()
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONPATH": str(SRC)})
        wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {"report": json.loads(done.stdout), "wall_s": wall,
            "load_before": list(load_before), "load_after": list(os.getloadavg())}


def run_once(model: str, ranks: int, *, rounds: int, seconds: float,
             timeout_s: float) -> dict[str, Any]:
    """One ``pipeweave auto --model M --ranks R --run --json``; its report and the load."""
    done = run_auto(model, ranks, extra=["--run", "--rounds", str(rounds), "--run-seconds",
                                         str(seconds)], timeout_s=timeout_s)
    report = done.pop("report")
    return {**done, "winner": _shape(report["winner"]), "default": _shape(report["default"]),
            "measured": report["measured"], "calibration": report.get("calibration"),
            "retimed": report.get("retimed")}


Search = Callable[[str, int], dict[str, Any]]
"""``(model, ranks) -> {"report": auto's JSON, ...}``: one search without ``--run``."""

Timer = Callable[[str, Plan, int], float]
"""``(label, plan, steps) -> measured seconds per iteration``."""


def two_profiles(model: str, ranks: int, *, rounds: int, seconds: float, search: Search,
                 time_one: Timer | None = None) -> dict[str, Any]:
    """``search`` twice (two profiles, two calibrations), then both winners measured in
    alternating rounds (``time_one``: default, real runs of :func:`plan_timer`)."""
    runs = [search(model, ranks) for _ in range(2)]
    reports = {f"profile {k + 1}": run["report"] for k, run in enumerate(runs)}
    if time_one is None:
        timer = plan_timer(model=model, batch_size=runs[0]["report"]["batch_size"],
                           apc={label: r["winner"]["apc"] for label, r in reports.items()})

        def time_one(label: str, plan: Plan, steps: int) -> float:
            return timer(label, plan, steps)[0]

    plans = {label: (Plan.from_json(r["winner"]["plan"]), r["winner"]["predicted_iteration_time"])
             for label, r in reports.items()}
    measured = alternate(plans, rounds=rounds, seconds=seconds, steps=None, time_one=time_one)
    return {**profile_pair(reports, measured),
            "searches": [{k: v for k, v in run.items() if k != "report"} for run in runs]}


def profile_pair(reports: Mapping[str, dict[str, Any]],
                 measured: Mapping[str, Rounds]) -> dict[str, Any]:
    """Per profile its winner, predicted and measured samples/s (the median of its rounds);
    ``ratio``: the slower winner's measured samples/s over the faster's (for the same plan
    twice, the machine's noise: within 5 % by construction)."""
    winners: dict[str, Any] = {}
    for label, report in reports.items():
        row = report["winner"]
        samples = report["batch_size"] * row["pipelines"]
        winners[label] = {"winner": _shape(row), "training": row["training"],
                          "predicted_samples_per_second": row["predicted_samples_per_second"],
                          "samples_per_second": samples / measured[label].median,
                          **measured[label].to_json()}
    speeds = [w["samples_per_second"] for w in winners.values()]
    ratio = min(speeds) / max(speeds)
    same = len({w["winner"] for w in winners.values()}) == 1
    return {"winners": winners, "same_plan": same, "ratio": ratio,
            "within_5_percent": same or ratio >= 0.95}


def pair_table(cases: Mapping[str, dict[str, Any]]) -> str:
    """Per case and profile: the winner, predicted and measured samples/s; the ratio."""
    lines = [f"{'case':<12} {'profile':<10} {'pred sps':>9} {'meas sps':>9} {'spread':>7}  winner"]
    for name, case in cases.items():
        for label, w in case["winners"].items():
            lines.append(f"{name:<12} {label:<10} {w['predicted_samples_per_second']:>9.1f} "
                         f"{w['samples_per_second']:>9.1f} {100 * w['spread']:>6.0f}%  "
                         f"{w['winner']}")
        lines.append(f"{name:<12} slower / faster measured: {case['ratio']:.3f} (within 5 %: "
                     f"{case['within_5_percent']}; same plan: {case['same_plan']})")
    return "\n".join(lines)


def _shape(row: dict[str, Any]) -> str:
    """A plan in one line: schedule, method, stages, replicas, M, N."""
    return (f"{row['schedule']} {row['method']} stages={row['stages']} "
            f"replicas={row['replicas']} M={row['microbatches']} N={row['pipelines']}")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per plan the median and largest error over ``runs``; whether the winner stayed."""
    out: dict[str, Any] = {"same_winner": len({r["winner"] for r in runs}) == 1}
    for label in ("winner", "default"):
        errors = [r["measured"][label]["iteration_time_error"] for r in runs]
        out[f"{label}_median_error"] = statistics.median(errors)
        out[f"{label}_max_error"] = max(errors)
        again = [r["measured"][label]["retimed_error"] for r in runs
                 if "retimed_error" in r["measured"][label]]
        if len(again) == len(runs):  # re-fit from the calibration plans re-timed beside it
            out[f"{label}_retimed_median_error"] = statistics.median(again)
            out[f"{label}_retimed_max_error"] = max(again)
    ratios = [r["measured"]["default"]["iteration_time"] / r["measured"]["winner"]["iteration_time"]
              for r in runs]
    out["winner_speedup_median"] = statistics.median(ratios)
    return out


def _busy(row: dict[str, Any]) -> str:
    """``predicted:measured`` busy fraction of a measured plan (``-`` where the report has
    none): measured below predicted with the time right means compute priced high and
    waits missed; both off by the same factor, the compute."""
    if "busy_fraction" not in row:
        return "-"
    return f"{row['predicted_busy_fraction']:.2f}:{row['busy_fraction']:.2f}"


def _drift(run: dict[str, Any]) -> str:
    """The calibration plans' drift in one run (their re-timed median over the
    calibration's), ``-`` without a re-timing."""
    retimed = run.get("retimed")
    if not retimed:
        return "-"
    return " ".join(f"{100 * p['drift']:+.0f}%" for p in retimed["plans"].values())


def table(cases: dict[str, dict[str, Any]]) -> str:
    """Per run: predicted / measured ms and the error of each plan; per case the medians."""
    lines = [f"{'case':<12} {'run':>3} {'winner pred/meas ms':>20} {'err':>6} "
             f"{'default pred/meas ms':>21} {'err':>6} {'spread w/d':>11} "
             f"{'busy w/d pred:meas':>19} {'load':>5}  winner"]
    for name, case in cases.items():
        for index, run in enumerate(case["runs"], 1):
            w, d = run["measured"]["winner"], run["measured"]["default"]
            spread = f"{100 * w['spread']:.0f}/{100 * d['spread']:.0f} %"
            lines.append(
                f"{name:<12} {index:>3} "
                f"{1e3 * w['predicted_iteration_time']:>9.2f}/{1e3 * w['iteration_time']:<10.2f}"
                f"{100 * w['iteration_time_error']:>5.1f}% "
                f"{1e3 * d['predicted_iteration_time']:>10.2f}/{1e3 * d['iteration_time']:<10.2f}"
                f"{100 * d['iteration_time_error']:>5.1f}% "
                f"{spread:>11} {_busy(w) + '/' + _busy(d):>19} "
                f"{run['load_before'][0]:>5.2f}  {run['winner']}")
        s = case["summary"]
        lines.append(f"{name:<12} median error: winner {100 * s['winner_median_error']:.1f} % "
                     f"(max {100 * s['winner_max_error']:.1f}), default "
                     f"{100 * s['default_median_error']:.1f} % (max "
                     f"{100 * s['default_max_error']:.1f}); same winner every run: "
                     f"{s['same_winner']}; measured winner {s['winner_speedup_median']:.2f}x "
                     "the default")
        if "winner_retimed_median_error" in s:
            lines.append(f"{name:<12} re-fit from the calibration plans re-timed beside them: "
                         f"winner {100 * s['winner_retimed_median_error']:.1f} % (max "
                         f"{100 * s['winner_retimed_max_error']:.1f}), default "
                         f"{100 * s['default_retimed_median_error']:.1f} % (max "
                         f"{100 * s['default_retimed_max_error']:.1f}); drift per run: "
                         + "; ".join(_drift(run) for run in case["runs"]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", type=_case, default=[_case(c) for c in DEFAULT_CASES],
                        metavar="MODEL:RANKS", help=f"default: {' '.join(DEFAULT_CASES)}")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the command per case")
    parser.add_argument("--rounds", type=int, default=3, help="auto --run's --rounds")
    parser.add_argument("--run-seconds", type=float, default=1.0, help="auto --run's --run-seconds")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument("--json-out", type=Path, default=Path("benchmarks/results/auto_predict.json"))
    parser.add_argument("--two-profiles", action="store_true",
                        help="per case: two searches from two profiles, both winners measured "
                             "alternating (module docstring)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.two_profiles:
        return _main_two_profiles(args)
    cases: dict[str, dict[str, Any]] = {}
    for model, ranks in args.cases:
        runs = []
        for index in range(args.repeats):
            print(f"{model} {ranks} ranks: run {index + 1}/{args.repeats} ...", file=sys.stderr,
                  flush=True)
            runs.append(run_once(model, ranks, rounds=args.rounds, seconds=args.run_seconds,
                                 timeout_s=args.timeout))
        cases[f"{model}:{ranks}"] = {"runs": runs, "summary": summarize(runs)}
    print(table(cases))
    _write_json(args, "pipeweave auto --model M --ranks R --run --json", cases)
    return 0


def _write_json(args: argparse.Namespace, command: str, cases: dict[str, Any]) -> None:
    """``cases`` with the date, the command measured and the rounds, to ``--json-out``."""
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command,
        "rounds": args.rounds, "run_seconds": args.run_seconds, "cases": cases}, indent=1))
    print(f"wrote {args.json_out}", file=sys.stderr)


def _main_two_profiles(args: argparse.Namespace) -> int:
    def search(model: str, ranks: int) -> dict[str, Any]:
        return run_auto(model, ranks, extra=[], timeout_s=args.timeout)

    cases = {}
    for model, ranks in args.cases:
        print(f"{model} {ranks} ranks: two profiles ...", file=sys.stderr, flush=True)
        cases[f"{model}:{ranks}"] = two_profiles(model, ranks, rounds=args.rounds,
                                                 seconds=args.run_seconds, search=search)
    print(pair_table(cases))
    _write_json(args, "pipeweave auto --model M --ranks R --json, twice; both winners alternating",
                cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
