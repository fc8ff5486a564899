"""Benchmark: what a surviving large candidate costs to build and time (issue 29, item 3).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/schedule_columns.py
        [interleaved-1f1b:256:2:2048:4 ...]     # schedule:depth:chunks:M:width
        [--json-out benchmarks/results/schedule_columns.json]

For each shape (copy 0 of ``width`` copies, 1,000 uniform blocks, uneven per-stage costs),
the CPU seconds (``time.process_time``) of each phase on both paths the search may take:
the reference (the generator's actions, copy 0 with its all-reduces, the action index, the
first timing walked, the second compiled from the actions, the held counts of the memory
floor) and, for every schedule ``schedules.flush_arrays`` covers, the programs as numpy
columns (build, compile, time, held counts); and that both give the same iteration time.
Prints a line per path and shape, and writes every number to ``--json-out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pipeweave.auto.copies import one_copy_plan, one_copy_schedule
from pipeweave.ir.walk import index_actions
from pipeweave.memory.held_counts import held_peak_bytes
from pipeweave.planner.plan import Plan
from pipeweave.schedules.flush_arrays import flush_arrays
from pipeweave.sim import Costs, simulate_timing
from pipeweave.sim.compiled_arrays import compile_arrays, time_arrays

SHAPES = ("interleaved-1f1b:256:2:2048:4", "interleaved-1f1b:256:2:8192:4",
          "1f1b:256:1:8192:4", "gpipe-grouped:256:2:2048:4", "zbv:256:2:2048:4",
          "dualpipev:256:2:2048:4", "zb-h1:256:1:2048:4", "v-half:256:2:2048:4",
          "interleaved-zb:256:2:2048:4", "sliced-1f1b:256:1:2048:4", "avgpipe:256:1:2048:4")
T = TypeVar("T")


def timed(work: Callable[[], T]) -> tuple[T, float]:
    started = time.process_time()
    value = work()
    return value, time.process_time() - started


def measure(text: str) -> dict[str, Any]:
    """Both paths' CPU seconds per phase for one ``schedule:depth:chunks:M:width`` shape."""
    name, *numbers = text.split(":")
    depth, chunks, microbatches, width = map(int, numbers)
    plan = Plan.uniform(1000, depth, chunks=chunks, schedule=name,
                        microbatches=microbatches, width=width)
    stages = depth * chunks
    costs = Costs(forward=[1.0 + 0.01 * (s % 7) for s in range(stages)],
                  backward=[2.0 + 0.02 * (s % 5) for s in range(stages)], all_reduce=0.5)
    sizes = [1.0 + s % 3 for s in range(stages)]
    schedule, build = timed(lambda: one_copy_schedule(plan, 1))
    index, indexed = timed(lambda: index_actions(schedule))
    walked, walk = timed(lambda: simulate_timing(schedule, costs, index=index))
    _, compiled = timed(lambda: simulate_timing(schedule, costs, index=index))
    _, held = timed(lambda: held_peak_bytes(schedule, sizes))
    row: dict[str, Any] = {"shape": text, "actions": sum(len(p) for p in schedule.programs),
                           "reference": {"build": build, "index": indexed, "walk": walk,
                                         "compile_and_time": compiled, "held_counts": held}}
    print(f"{text}: {row['actions']} actions; reference: build {build:.2f}, index "
          f"{indexed:.2f}, first timing (walk) {walk:.2f}, second (compile + time) "
          f"{compiled:.2f}, held counts {held:.2f} CPU-s", flush=True)
    del schedule, index
    shape = one_copy_plan(plan).shape(1)
    columns, build = timed(lambda: flush_arrays(name, shape, reduce_before_step=True))
    if columns is None:
        return row
    graph, compile_seconds = timed(lambda: compile_arrays(columns))
    timing, timing_seconds = timed(lambda: time_arrays(columns, graph, costs))
    _, held = timed(lambda: columns.held_peak_bytes(sizes))
    same = timing is not None and timing.iteration_time == walked.iteration_time
    row["columns"] = {"build": build, "compile": compile_seconds, "time": timing_seconds,
                      "held_counts": held, "same_time": same}
    print(f"    columns: build {build:.2f}, compile {compile_seconds:.2f}, time "
          f"{timing_seconds:.2f}, held counts {held:.2f} CPU-s; same time: {same}",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES,
                        help="schedule:depth:chunks:M:width (default: the table's shapes)")
    parser.add_argument("--json-out", type=Path,
                        default=Path("benchmarks/results/schedule_columns.json"))
    args = parser.parse_args()
    rows = [measure(text) for text in args.shapes]
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "unit": "CPU seconds",
        "rows": rows}, indent=1))
    print(f"wrote {args.json_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
