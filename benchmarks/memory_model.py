"""Benchmark: predicted against measured peak memory per rank, for every schedule (issue 16).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/memory_model.py
        [--quick] [--schedules 1f1b gpipe ...] [--steps 3]
        [--json-out benchmarks/results/memory_model.json]

gpt-tiny on 2 ranks, batch 16 in 4 micro-batches, Adam (SpecTrain: SGD with momentum 0.9, the
optimizer it predicts with), every registered schedule with its default options and chunks
(``--quick``: 1f1b, gpipe, pipedream, zb-h1). The model is
profiled once at the micro-batch size (4 samples); each schedule then trains ``--steps``
steps on real processes with ``Job.track_allocations``, which measures each rank's peak
bytes of live tensors at torch's allocator (runtime/observation/allocations.py), and
``planner.memory.predicted_memory`` predicts the same quantity from the profile and the plan.
Prints a table (predicted, measured, error per rank) and writes JSON with every part of the
prediction. The process's peak RSS is reported too, to show why it is not what is compared
(the interpreter and torch's libraries are ~300 MB beside a few MB of tensors).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeweave.models import default_seq_len
from pipeweave.planner import Plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.profiler.measure import profile_builtin
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, launch_local
from pipeweave.schedules import available_schedules, get_info

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "memory_model.json"
MODEL, RANKS, BATCH, MICROBATCHES, OPTIMIZER = "gpt-tiny", 2, 16, 4, "adam"
QUICK = ("1f1b", "gpipe", "pipedream", "zb-h1")
OWN_OPTIMIZER = {"spectrain": (OptimizerFactory("sgd", {"lr": 1e-3, "momentum": 0.9}),
                               "sgd-momentum")}
"""Schedules that need another optimizer (SpecTrain predicts with SGD's momentum buffer): the
runtime's factory and the memory model's name for it."""


def plan_for(schedule: str, blocks: int) -> Plan:
    info = get_info(schedule)
    return Plan.uniform(blocks, RANKS, chunks=info.default_chunks, schedule=schedule,
                        microbatches=MICROBATCHES)


def measure(plan: Plan, steps: int, optimizer: OptimizerFactory) -> list[dict[str, Any]]:
    seq_len = default_seq_len(MODEL)
    job = Job(plan=plan, steps=steps, model=BuiltinModel(MODEL),
              data=BuiltinData("stdlib-bytes", batch_size=BATCH, seq_len=seq_len, seed=0),
              optimizer=optimizer, track_allocations=True,
              record_timeline=False, timeout_s=120.0)
    return [{"allocated": r.peak_allocated_bytes, "rss": r.peak_memory_bytes,
             "weight_copies": r.peak_weight_copies, "stashed": r.peak_stashed_microbatches}
            for r in sorted(launch_local(job), key=lambda r: r.rank)]


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--schedules", nargs="+", help="these schedules (default: every one)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.quick and args.schedules:
        parser.error("give --quick or --schedules, not both")
    names = list(args.schedules or (QUICK if args.quick else
                                    [info.name for info in available_schedules()]))
    profile = profile_builtin(MODEL, batch_size=BATCH // MICROBATCHES, warmup=0, repeats=1,
                              optimizer=OPTIMIZER)
    rows = []
    print(f"{'schedule':<18}{'rank':>5}{'predicted MB':>14}{'measured MB':>13}{'error':>9}")
    for name in names:
        plan = plan_for(name, profile.num_blocks)
        factory, optimizer = OWN_OPTIMIZER.get(name, (OptimizerFactory(OPTIMIZER), OPTIMIZER))
        started = time.perf_counter()
        try:
            measured = measure(plan, args.steps, factory)
        except Exception as error:  # a schedule that cannot run here is reported, not fatal
            rows.append({"schedule": name, "status": f"failed: {error}"})
            print(f"{name:<18} failed: {str(error).splitlines()[0]}")
            continue
        predicted = predicted_memory(profile, plan, batch_size=BATCH, optimizer=optimizer)
        ranks = []
        for rank, (p, m) in enumerate(zip(predicted, measured)):
            error = (p.total - m["allocated"]) / m["allocated"]
            ranks.append({"rank": rank, "predicted": p.total, "parts": asdict(p),
                          "measured": m["allocated"], "error": error, "rss": m["rss"],
                          "runtime_weight_copies": m["weight_copies"],
                          "runtime_stashed_microbatches": m["stashed"]})
            print(f"{name if rank == 0 else '':<18}{rank:>5}{p.total / 1e6:>14.3f}"
                  f"{m['allocated'] / 1e6:>13.3f}{100 * error:>+8.1f}%")
        rows.append({"schedule": name, "status": "ok", "chunks": plan.chunks,
                     "optimizer": optimizer, "ranks": ranks,
                     "seconds": time.perf_counter() - started})
    errors = [abs(r["error"]) for row in rows if row["status"] == "ok" for r in row["ranks"]]
    result = {"model": MODEL, "ranks": RANKS, "batch_size": BATCH, "microbatches": MICROBATCHES,
              "optimizer": OPTIMIZER, "steps": args.steps,
              "measured": "peak live tensor bytes per rank at torch's allocator "
                          "(Job.track_allocations)",
              "max_abs_error": max(errors, default=0.0), "rows": rows}
    print(f"largest |error| {100 * result['max_abs_error']:.1f}% over {len(errors)} ranks")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
