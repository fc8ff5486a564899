"""Scale benchmark: build and simulate every registered schedule at 64 stages x 512 micro-batches.

Run::

    PYTHONPATH=src python benchmarks/simulate_scale.py [--stages 64] [--microbatches 512]
        [--repeat 3] [--json-out benchmarks/results/simulate_scale.json] [--only NAME ...]

Each schedule is built with one iteration (or the fewest its generator accepts; asynchronous
schedules need none extra), ``chunks=2`` for the schedules that place two model chunks per
rank, and simulated with the default costs (F=1, B=2, C=0). Times are the best of
``--repeat`` runs (wall clock, seconds); the goal is a simulation under one second each.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from pipeweave.schedules import Shape, available_schedules, build_schedule
from pipeweave.sim import simulate

CHUNKED = {"interleaved-1f1b": 2, "wpipe": 2}
"""Schedules that hold several model chunks per rank, and the chunk count used here."""

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "simulate_scale.json"


def bench_one(name: str, stages: int, microbatches: int, repeat: int) -> dict[str, object]:
    """Best-of-``repeat`` build and simulate times for schedule ``name``."""
    chunks = CHUNKED.get(name, 1)
    build_s = simulate_s = float("inf")
    schedule = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        schedule = build_schedule(name, Shape(stages, microbatches, iterations=1, chunks=chunks))
        t1 = time.perf_counter()
        result = simulate(schedule)
        t2 = time.perf_counter()
        build_s, simulate_s = min(build_s, t1 - t0), min(simulate_s, t2 - t1)
    assert schedule is not None
    actions = sum(len(p) for p in schedule.programs)
    return {
        "schedule": name, "stages": schedule.num_stages, "ranks": schedule.num_ranks,
        "microbatches": microbatches, "chunks": chunks, "actions": actions,
        "build_s": round(build_s, 4), "simulate_s": round(simulate_s, 4),
        "iteration_time": result.iteration_time, "bubble_fraction": result.bubble_fraction,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", default=None, help="schedule names (default: all)")
    args = parser.parse_args(argv)

    names = args.only or [info.name for info in available_schedules()]
    rows = []
    print(f"{'schedule':<18} {'ranks':>5} {'stages':>6} {'actions':>8} {'build s':>8} "
          f"{'simulate s':>10}")
    for name in names:
        try:
            row = bench_one(name, args.stages, args.microbatches, args.repeat)
        except ValueError as error:  # a generator that rejects this shape
            print(f"{name:<18} skipped: {error}")
            rows.append({"schedule": name, "skipped": str(error)})
            continue
        rows.append(row)
        print(f"{name:<18} {row['ranks']:>5} {row['stages']:>6} {row['actions']:>8} "
              f"{row['build_s']:>8.3f} {row['simulate_s']:>10.3f}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    report = {"python": platform.python_version(), "machine": platform.machine(),
              "stages": args.stages, "microbatches": args.microbatches, "results": rows}
    args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
