"""Benchmark: how much one run's measured peak moves, per rank, on sharded stages (the flaky
``test_sharding_memory.py`` case), quiet and with the machine loaded.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/shard_peaks.py
        [--runs 20] [--busy 2] [--shard full] [--schedule 1f1b] [--label after]
        [--json-out benchmarks/results/shard_peaks.json]

gpt-small, ``pp=2,dp=2``, batch 4 in 4 micro-batches, Adam, the plan
``tests/runtime/test_sharding_memory.py`` measures, run as ``pipeweave train --plan`` runs it
for four steps with ``Job.track_allocations`` (peak live tensor bytes at torch's allocator,
``pipeweave.measure.peak_memory``), ``--runs`` single runs one after another. ``--busy N``
starts N busy Python loops for the duration (the loaded machine of CI) and stops them after.
Prints each rank's least, median and largest peak beside the memory model's prediction and
appends a record (peaks of every run, load averages) to the JSON file under ``--label``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeweave.measure import peak_memory
from pipeweave.planner import Plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.profiler.measure import profile_builtin

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "shard_peaks.json"
MODEL, STAGES, WIDTH, BATCH, MICROBATCHES = "gpt-small", 2, 2, 4, 4


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=0, help="busy loops loading the machine")
    parser.add_argument("--shard", default="full")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--label", default="run")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    profile = profile_builtin(MODEL, batch_size=1, warmup=0, repeats=1, optimizer="adam")
    plan = Plan.uniform(profile.num_blocks, STAGES, schedule=args.schedule,
                        microbatches=MICROBATCHES, width=WIDTH, shard=args.shard)
    predicted = [r.total for r in predicted_memory(profile, plan, batch_size=BATCH,
                                                   optimizer="adam")]
    loops = busy_loops(args.busy)
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.runs):
            peaks = peak_memory(plan, model=MODEL, batch_size=BATCH, timeout_s=300.0)
            runs.append({"peaks": peaks, "load": os.getloadavg()[0]})
            print(f"peaks MB {[round(p / 1e6, 3) for p in peaks]}  load {runs[-1]['load']:.1f}",
                  flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(f"\n{args.label}: {args.shard} {args.schedule}, {args.runs} runs, {args.busy} busy "
          f"loops, load {min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}")
    print("rank  predicted MB  least  median  largest  runs over 10 %")
    for rank, p in enumerate(predicted):
        mine = [r["peaks"][rank] for r in runs]
        over = sum(abs(p - m) / m >= 0.10 for m in mine)
        print(f"{rank:4d}  {p / 1e6:12.2f}  {min(mine) / 1e6:5.2f}  "
              f"{statistics.median(mine) / 1e6:6.2f}  {max(mine) / 1e6:7.2f}  {over:3d}")
    record = {"label": args.label, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "model": MODEL, "shard": args.shard, "schedule": args.schedule,
              "busy_loops": args.busy, "predicted": predicted, "runs": runs}
    old = json.loads(args.json_out.read_text()) if args.json_out.exists() else []
    args.json_out.write_text(json.dumps([*old, record], indent=1) + "\n")


if __name__ == "__main__":
    main()
