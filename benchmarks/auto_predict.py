"""Benchmark: how close ``pipeweave auto --model M --ranks R --run`` predicts the iteration
time of its winner and of the default plan (issue 29, item 2: within 10 %, median over three
runs), and whether the winner stays the same from run to run.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/auto_predict.py \
        [--cases gpt-tiny:2 cnn:2] [--repeats 3] [--json-out benchmarks/results/auto_predict.json]
    ... benchmarks/auto_predict.py --cases gpt-tiny:2 gpt-tiny:4 gpt-small:2 gpt-small:4 cnn:2 cnn:4

Each run is the whole command, from scratch, as a user types it (a fresh profile, calibration,
search, and ``--run``: the winner and the default in ``--rounds`` alternating rounds of about
``--run-seconds`` each, median reported), ``--repeats`` times per case, one case after
another. Per run: the winner's shape, the predicted and measured (median) iteration time
and the error of each plan, the rounds' spread, the fitted calibration, the machine's load
average before and after. Per case: the median error of the winner and of the default over
the runs, the largest, and whether every run picked the same plan. The JSON (``--json-out``)
holds all of it.

One run of gpt-tiny or cnn at 2 ranks took 45-85 s on this 2-core machine at load 3-5
(2026-11-27: profiling two micro-batch sizes; the calibration: link, runtime costs, the
all-reduce at six sizes, 3 rounds of 2 plans; the search; 3 rounds of 2 plans and 2 memory
runs), so the two default cases x 3 runs take some 5-9 minutes. gpt-small runs take longer
(its iterations are ~0.25-1 s: one ``auto`` at 4 ranks took 2:40 at load 7, without
``--run``). Read the load averages and the spreads: a loaded machine moves the times.
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
from pathlib import Path
from typing import Any

DEFAULT_CASES = ("gpt-tiny:2", "cnn:2")
SRC = Path(__file__).resolve().parents[1] / "src"


def _case(text: str) -> tuple[str, int]:
    model, _, ranks = text.partition(":")
    if not model or not ranks.isdigit() or int(ranks) < 1:
        raise argparse.ArgumentTypeError(f"case {text!r}: give MODEL:RANKS, e.g. gpt-tiny:2")
    return model, int(ranks)


def run_once(model: str, ranks: int, *, rounds: int, seconds: float,
             timeout_s: float) -> dict[str, Any]:
    """One ``pipeweave auto --model M --ranks R --run --json``; its report and the load."""
    with tempfile.TemporaryDirectory(prefix="auto-predict-") as folder:
        command = [sys.executable, "-m", "pipeweave", "auto", "--model", model, "--ranks",
                   str(ranks), "--run", "--json", "--rounds", str(rounds), "--run-seconds",
                   str(seconds), "--out", f"{folder}/plan.json", "--plot", f"{folder}/p.png"]
        load_before = os.getloadavg()
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONPATH": str(SRC)})
        wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return {"wall_s": wall, "load_before": list(load_before), "load_after": list(os.getloadavg()),
            "winner": _shape(report["winner"]), "default": _shape(report["default"]),
            "measured": report["measured"], "calibration": report.get("calibration")}


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
    ratios = [r["measured"]["default"]["iteration_time"] / r["measured"]["winner"]["iteration_time"]
              for r in runs]
    out["winner_speedup_median"] = statistics.median(ratios)
    return out


def table(cases: dict[str, dict[str, Any]]) -> str:
    """Per run: predicted / measured ms and the error of each plan; per case the medians."""
    lines = [f"{'case':<12} {'run':>3} {'winner pred/meas ms':>20} {'err':>6} "
             f"{'default pred/meas ms':>21} {'err':>6} {'spread w/d':>11} {'load':>5}  winner"]
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
                f"{spread:>11} "
                f"{run['load_before'][0]:>5.2f}  {run['winner']}")
        s = case["summary"]
        lines.append(f"{name:<12} median error: winner {100 * s['winner_median_error']:.1f} % "
                     f"(max {100 * s['winner_max_error']:.1f}), default "
                     f"{100 * s['default_median_error']:.1f} % (max "
                     f"{100 * s['default_max_error']:.1f}); same winner every run: "
                     f"{s['same_winner']}; measured winner {s['winner_speedup_median']:.2f}x "
                     "the default")
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
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
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
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "pipeweave auto --model M --ranks R --run --json",
        "rounds": args.rounds, "run_seconds": args.run_seconds, "cases": cases}, indent=1))
    print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
