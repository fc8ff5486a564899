"""Benchmark: a sharded stage's gathers prefetched in the schedule's order, or FSDP2's own.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/prefetch_gathers.py
        [--schedules 1f1b interleaved-1f1b] [--steps 8] [--repeats 2] [--microbatches 8]
        [--json-out benchmarks/results/prefetch_gathers.json]

gpt-small (d128, 8 layers, T 128), batch 8, SGD, ``--mesh pp=2,dp=2 --shard full``: each
schedule runs with ``Job.prefetch_gathers`` on (each action's first all-gather started one
action early, docs/sharding.md) and off (``--no-prefetch-gathers``: each block gathered when
its FSDP2 hook fires), the two alternating ``--repeats`` times. A row is the median over the
repeats of each run's median steady-state step (iterations 2..K), the foreign CPU load while
it ran, and whether the two trained the same losses (they must: a gather is a copy).

On CPU over gloo the overlap is limited: the all-gather runs on gloo's own thread, so it
overlaps compute only where a core is free, and on a machine shared with other jobs the
step times move by more than the difference measured here. Read it as a smoke test of the
overlap, not as a GPU figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad  # noqa: E402

from pipeweave.models.registry import default_seq_len  # noqa: E402
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan  # noqa: E402
from pipeweave.runtime import launch_local  # noqa: E402
from pipeweave.runtime.observation.summary import summarize  # noqa: E402

MODEL, BATCH, BLOCKS = "gpt-small", 8, 18  # gpt-small: 8 layers as 16 blocks + embed + head


def job(schedule: str, *, steps: int, microbatches: int, prefetch: bool) -> Job:
    """gpt-small on ``pp=2,dp=2 --shard full`` (two chunks per rank for interleaved)."""
    chunks = 2 if schedule.startswith("interleaved") else 1
    plan = Plan.uniform(BLOCKS, 2, chunks=chunks, schedule=schedule, microbatches=microbatches,
                        width=2, shard="full")
    return Job(plan=plan, steps=steps, model=BuiltinModel(MODEL),
               data=BuiltinData("stdlib-bytes", batch_size=BATCH,
                                seq_len=default_seq_len(MODEL)),
               optimizer=OptimizerFactory("sgd", {"lr": 0.01}), timeout_s=300.0,
               prefetch_gathers=prefetch)


def one_run(schedule: str, *, steps: int, microbatches: int, prefetch: bool) -> dict[str, Any]:
    """One run: its median steady-state step, its losses and the foreign load meanwhile."""
    this = job(schedule, steps=steps, microbatches=microbatches, prefetch=prefetch)
    with ForeignLoad() as load:
        results = launch_local(this, deadline_s=900)
    summary = summarize(results, schedule=schedule, steps=steps, batch_size=BATCH,
                        microbatches=microbatches)
    ends = summary.iteration_end_s
    steps_s = [b - a for a, b in zip(ends, ends[1:])]
    return {"step_s": statistics.median(steps_s), "losses": summary.losses,
            "foreign_load": load.share}


def row(schedule: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--repeats`` runs each way, alternating; medians and the losses' agreement."""
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for prefetch in (False, True):
            runs[prefetch].append(one_run(schedule, steps=args.steps,
                                          microbatches=args.microbatches, prefetch=prefetch))
    on, off = (statistics.median(r["step_s"] for r in runs[p]) for p in (True, False))
    return {"schedule": schedule, "step_s_prefetch": on, "step_s_fsdp2_order": off,
            "ratio": off / on, "same_losses": all(
                a["losses"] == b["losses"] for a, b in zip(runs[True], runs[False])),
            "foreign_load": statistics.median(r["foreign_load"] for p in runs for r in runs[p]),
            "runs": {str(p): [r["step_s"] for r in runs[p]] for p in runs}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", nargs="+", default=["1f1b", "interleaved-1f1b"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print(f"{'schedule':<18} {'prefetch':>10} {'FSDP2 order':>12} {'ratio':>6} "
          f"{'same losses':>12} {'foreign load':>13}")
    for schedule in args.schedules:
        found = row(schedule, args)
        rows.append(found)
        print(f"{schedule:<18} {found['step_s_prefetch'] * 1e3:>8.0f}ms "
              f"{found['step_s_fsdp2_order'] * 1e3:>10.0f}ms {found['ratio']:>6.2f} "
              f"{str(found['same_losses']):>12} {found['foreign_load']:>12.0%}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"model": MODEL, "batch": BATCH, "mesh": "pp=2,dp=2",
                                             "shard": "full", **vars(args), "rows": rows},
                                            default=str, indent=1))


if __name__ == "__main__":
    main()
