"""Benchmark: the planner's predicted iteration time against real runs of the same plans.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/simulator_fidelity.py
        [--model gpt-small] [--ranks 2 4] [--steps 6] [--json-out benchmarks/results/fidelity.json]

For each rank count: profile the model once (one micro-batch, the intra-op threads one rank
gets, the optimizer step included) and measure the loopback link; plan it with several
methods; predict each plan's iteration time with the simulator (``make_plan``) and measure it
with real processes (``launch_local``: forkserver, gloo): the median over iterations 2..K of
the time between consecutive iteration ends on the measured timeline, and of ``--repeats``
runs the fastest (on a machine shared with other jobs, load only ever slows a run down). Prints the error table
(|predicted - measured| / measured) and whether the predicted ranking of the plans matches the
measured one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from pipeweave.models.gpt import GPT_PRESETS
from pipeweave.planner import PlanRequest, make_plan
from pipeweave.profiler import measure_link, profile_builtin
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory
from pipeweave.runtime.distributed import threads_per_rank
from pipeweave.runtime.launch import launch_local
from pipeweave.runtime.summary import iteration_end_times

# -- settings ----------------------------------------------------------------------------------
MICROBATCH = 4  # samples per micro-batch (what the profile measures)
PLANS: list[tuple[str, dict[str, Any]]] = [
    ("uniform", {}),
    ("uniform", {"schedule": "gpipe"}),
    ("time", {}),
    ("autopipe", {}),
    ("autopipe", {"slicer": True}),
]


def measured_iteration_time(job: Job) -> float:
    results = launch_local(job, deadline_s=600)
    records = [r for result in results for r in result.records]
    ends = iteration_end_times(records, job.plan.microbatches, job.steps)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return statistics.median(gaps[1:] if len(gaps) > 2 else gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-small", choices=sorted(GPT_PRESETS))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, default=None, help="default 2 x ranks")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="runs per plan (fastest kept)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    seq_len = GPT_PRESETS[args.model].seq_len
    link = measure_link()
    print(f"link: {link.bandwidth / 1e9:.2f} GB/s, latency {1e6 * link.latency:.0f} us")
    rows: list[dict[str, Any]] = []
    for ranks in args.ranks:
        profile = profile_builtin(args.model, batch_size=MICROBATCH, threads=threads_per_rank(ranks),
                                  repeats=7).with_link(link)
        microbatches = args.microbatches or 2 * ranks
        for method, options in PLANS:
            result = make_plan(PlanRequest(profile, ranks, microbatches=microbatches, **options), method)
            job = Job(plan=result.plan, steps=args.steps, model=BuiltinModel(args.model),
                      data=BuiltinData("stdlib-bytes", batch_size=MICROBATCH * microbatches,
                                       seq_len=seq_len),
                      optimizer=OptimizerFactory("adam"), timeout_s=120)
            measured = min(measured_iteration_time(job) for _ in range(args.repeats))
            predicted = result.predicted_iteration_time
            label = method + "".join(f" {k}={v}" for k, v in options.items())
            rows.append({"ranks": ranks, "plan": label, "schedule": result.plan.schedule,
                         "stages": [list(s) for s in result.plan.stages],
                         "predicted_s": predicted, "measured_s": measured,
                         "error": abs(predicted - measured) / measured})
            print(f"R={ranks} {label:<24} predicted {1e3 * predicted:8.2f} ms  measured "
                  f"{1e3 * measured:8.2f} ms  error {100 * rows[-1]['error']:5.1f} %", flush=True)

    print(f"\n{'ranks':>5} {'plan':<24} {'schedule':<12} {'predicted ms':>12} {'measured ms':>12} "
          f"{'error %':>8}")
    for row in rows:
        print(f"{row['ranks']:>5} {row['plan']:<24} {row['schedule']:<12} "
              f"{1e3 * row['predicted_s']:>12.2f} {1e3 * row['measured_s']:>12.2f} "
              f"{100 * row['error']:>8.1f}")
    for ranks in args.ranks:
        mine = [r for r in rows if r["ranks"] == ranks]
        by_prediction = [r["plan"] for r in sorted(mine, key=lambda r: r["predicted_s"])]
        by_measurement = [r["plan"] for r in sorted(mine, key=lambda r: r["measured_s"])]
        print(f"R={ranks}: ranking predicted {by_prediction}\n      measured  {by_measurement}"
              f"  -> {'same' if by_prediction == by_measurement else 'differs'}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
