"""Benchmark: ``pipeweave auto``'s winner against the default plan and the README's plans,
measured on real processes (issue 16).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/auto.py
        [--models gpt-small cnn] [--ranks 2 4] [--rounds 3] [--steps 6]
        [--json-out benchmarks/results/auto.json]
    ... benchmarks/auto.py --quick     # gpt-tiny, 2 ranks, 1 round, 3 steps: checks it runs

For every model and rank count: the model is profiled as ``pipeweave auto --model`` does it
(``pipeweave profile`` at the default micro-batch, with the link, the runtime's costs per
action and, when the ranks outnumber the cores, the co-located steps; and at a quarter of it),
and ``pipeweave auto --model M --profile ... --profile ... --ranks R --json`` searches and
writes the winner's plan; every plan of the case is predicted from those same profiles. Then, in each of ``--rounds`` rounds, every plan is
trained for ``--steps`` steps on local processes one after another (alternating, so that the
machine's drift hits every plan alike; the same runner ``auto --run`` uses,
``pipeweave.measure.measure_plan``):

Each plan runs ``--steps`` steps or more: enough for about a second of timed iterations at its
predicted speed (``pipeweave.measure.timed_steps``, as auto's own calibration run).

* **winner**: auto's plan;
* **default**: 1F1B, uniform split over all ranks, M = 2 x ranks (what ``pipeweave train``
  runs without options);
* **README plans**: what a user could pick from the README's command lines: AutoPipe's split
  (``pipeweave plan --method autopipe``) under each schedule the README shows (``1f1b``,
  ``gpipe``, ``zb-h1``, ``interleaved-1f1b`` with 2 chunks, ``zbv``), M = 2 x ranks; the best
  of them by measured median is "best README plan".

Reported per plan: predicted and median measured iteration time, samples/s, the simulator's
error |predicted - measured| / measured, and the winner's speed-up over each alternative
(measured). With 4 ranks on a 2-core machine the ranks share the cores: auto simulates that
(``--shared-cores auto``) and the error is stated separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeweave.auto import AutoProblem, search
from pipeweave.measure import DEFAULT_MICROBATCH, local_shared_cores, measure_plan, timed_steps
from pipeweave.planner.plan import Plan
from pipeweave.profiler import Profile
from pipeweave.profiler.colocated import needed_colocation

README_SCHEDULES = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "zbv")


def run_auto(model: str, ranks: int, folder: Path) -> tuple[dict[str, Any], list[Profile]]:
    """Profile ``model`` as ``pipeweave auto --model`` would (the default micro-batch with the
    link, the runtime's costs and, when the ranks outnumber the cores, the co-located steps;
    and a quarter of it), then ``pipeweave auto --profile ... --profile ...``; returns its JSON
    report and the profiles as the search used them (auto fits the message latency to a run of
    the default plan and writes the profile with it, ``--profile-out``), so that every plan of
    the case is predicted from the same ones."""
    paths = []
    for size in (DEFAULT_MICROBATCH, max(1, DEFAULT_MICROBATCH // 4)):
        path = folder / f"{model}-{ranks}-{size}.json"
        command = [sys.executable, "-m", "pipeweave", "profile", "--model", model,
                   "--batch-size", str(size), "--local-ranks", str(ranks), "--json-out", str(path)]
        if size != DEFAULT_MICROBATCH:
            command += ["--no-link", "--no-runtime-costs"]
        elif needed_colocation(ranks) > 1:
            command += ["--colocated-ranks", str(ranks)]
        subprocess.run(command, check=True, capture_output=True, text=True)
        paths.append(path)
    command = [sys.executable, "-m", "pipeweave", "auto", "--model", model, "--ranks",
               str(ranks), "--json", "--out", str(folder / f"auto-{model}-{ranks}.json"),
               "--plot", str(folder / f"auto-{model}-{ranks}.png")]
    for path in paths:
        command += ["--profile", str(path)]
    calibrated = folder / f"{model}-{ranks}-calibrated.json"
    command += ["--profile-out", str(calibrated)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"pipeweave auto failed for {model} on {ranks} ranks:\n{done.stderr}")
    return json.loads(done.stdout), [Profile.load(calibrated), Profile.load(paths[1])]


def readme_plans(profiles: list[Profile], ranks: int, batch: int,
                 schedules: tuple[str, ...]) -> dict[str, tuple[Plan, float]]:
    """AutoPipe's split under each README schedule, M = 2 x ranks: plan and prediction (the
    same search, restricted to that one combination)."""
    out = {}
    for schedule in schedules:
        profile, *others = profiles
        problem = AutoProblem(profile=profile, extra_profiles=tuple(others), ranks=ranks,
                              batch_size=batch,
                              schedules=(schedule,), methods=("autopipe",),
                              microbatches=(2 * ranks,), depths=(ranks,), recompute=(0,),
                              pipelines=(1,), shared_cores=local_shared_cores(profile, ranks=ranks))
        result = search(problem)
        if result.ranked:
            out[f"readme {schedule}"] = (result.winner.plan, result.winner.iteration_time)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt-small", "cnn"])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true",
                        help="gpt-tiny, 2 ranks, 1 round, 3 steps, two README plans")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    schedules = README_SCHEDULES
    if args.quick:
        args.models, args.ranks, args.rounds, args.steps = ["gpt-tiny"], [2], 1, 3
        schedules = ("1f1b", "zb-h1")

    report: dict[str, Any] = {"rounds": args.rounds, "steps": args.steps, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for ranks in args.ranks:
                auto, profiles = run_auto(model, ranks, Path(tmp))
                batch = auto["batch_size"]
                plans: dict[str, tuple[Plan, float, bool]] = {
                    "winner": (Plan.from_json(auto["winner"]["plan"]),
                               auto["winner"]["predicted_iteration_time"], auto["winner"]["apc"]),
                    "default": (Plan.from_json(auto["default"]["plan"]),
                                auto["default"]["predicted_iteration_time"], False)}
                for label, (plan, predicted) in readme_plans(profiles, ranks, batch,
                                                             schedules).items():
                    plans[label] = (plan, predicted, False)
                times: dict[str, list[float]] = {label: [] for label in plans}
                # at least --steps, and about a second of timed iterations: a median of a
                # handful of 10 ms iterations (cnn) moves by half between runs
                steps = {label: max(args.steps, timed_steps(predicted))
                         for label, (_, predicted, _) in plans.items()}
                for round_ in range(args.rounds):
                    for label, (plan, _, apc) in plans.items():
                        measured = measure_plan(plan, model=model, batch_size=batch,
                                                steps=steps[label], apc=apc, memory=False)
                        times[label].append(measured.iteration_time)
                        print(f"{model} R={ranks} round {round_ + 1} {label:<24} "
                              f"{measured.iteration_time * 1e3:8.1f} ms", flush=True)
                rows = []
                for label, (plan, predicted, _) in plans.items():
                    median = statistics.median(times[label])
                    rows.append({"plan": label, "schedule": plan.schedule,
                                 "stages": [list(s) for s in plan.stages],
                                 "microbatches": plan.microbatches, "chunks": plan.chunks,
                                 "width": plan.width, "pipelines": plan.pipelines,
                                 "steps": steps[label],
                                 "predicted_s": predicted, "measured_s": median,
                                 "measured_all_s": times[label],
                                 "samples_per_second": batch * plan.pipelines / median,
                                 "error": abs(predicted - median) / median})
                winner = rows[0]
                readme = [r for r in rows if r["plan"].startswith("readme")]
                # Speed-ups in samples/s: AvgPipe's N pipelines train N batches an iteration.
                best = (max(readme, key=lambda r: r["samples_per_second"]) if readme
                        else None)
                case = {"model": model, "ranks": ranks, "batch_size": batch,
                        "calibration": auto.get("calibration"),
                        "considered": auto["considered"], "pruned": auto["pruned"],
                        "simulated": auto["simulated"], "rows": rows,
                        "best_readme_plan": best["plan"] if best else None,
                        "speedup_vs_default": speedup(winner, rows[1]),
                        "speedup_vs_best_readme": speedup(winner, best) if best else None}
                report["cases"].append(case)
                print(format_case(case), flush=True)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


def speedup(row: dict[str, Any], other: dict[str, Any]) -> float:
    """How many times ``row``'s measured samples/s is ``other``'s."""
    return float(row["samples_per_second"] / other["samples_per_second"])


def format_case(case: dict[str, Any]) -> str:
    lines = [f"\n{case['model']} on {case['ranks']} ranks, batch {case['batch_size']} "
             f"({case['considered']} considered, {case['pruned']} pruned, "
             f"{case['simulated']} simulated)",
             f"{'plan':<24} {'schedule':<17} {'M':>3} {'predicted ms':>13} {'measured ms':>12} "
             f"{'error':>6} {'samples/s':>10}"]
    for r in case["rows"]:
        lines.append(f"{r['plan']:<24} {r['schedule']:<17} {r['microbatches']:>3} "
                     f"{r['predicted_s'] * 1e3:>13.1f} {r['measured_s'] * 1e3:>12.1f} "
                     f"{100 * r['error']:>5.1f}% {r['samples_per_second']:>10.1f}")
    readme = case["speedup_vs_best_readme"]
    lines.append(f"winner: {case['speedup_vs_default']:.2f}x the default"
                 + (f", {readme:.2f}x the best README plan ({case['best_readme_plan']})"
                    if readme is not None else "") + " (measured medians)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
