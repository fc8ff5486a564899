"""Benchmark: what checkpoints cost the asynchronous schedules — the drain and the writes.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/async_checkpoint_cost.py
        [--steps 200] [--every 50] [--repeats 3] [--json-out benchmarks/results/async_checkpoint_cost.json]

Per schedule (2 ranks as processes, M = 4, an MLP of width 256, Adam; SGD momentum for
SpecTrain), three runs, repeated and interleaved so the machine's load hits them alike:

* plain — no drain, no checkpoint;
* drain — ``--option drain=EVERY`` alone: the schedule's own cost of a checkpoint boundary,
  one fill and drain per EVERY steps (docs/semantics.md predicts ``(P-1)/(EVERY·M)``);
* checkpoints — ``--checkpoint-every EVERY``: the drain plus the background writes.

``avgpipe-auto`` is AvgPipe (N = 2) with ``--advance auto``: it flushes every step (no drain,
so "drain" is the plain run again), and its checkpoints end the online controller's windows
and save its state.

Training time is first recorded action to last over all ranks (start-up excluded); the
median of ``--repeats``. "stall" is the training thread's time in checkpoint hooks per
checkpoint, worst rank (``RankResult.checkpoint_stall_s``).

On a shared 2-core machine the wall times vary by tens of per cent from run to run, far more
than the effect, so the script also derives the estimate the table reports: the measured
stall per checkpoint over EVERY steps of the fastest of the three medians, plus the drain's
predicted share (the simulator's closed form, exact at unit costs; tests/schedules/test_drain.py).
``--derive FILE`` recomputes those fields of an existing result file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult,
                               launch_local)
from pipeweave.runtime.advance.options import AdvanceOptions
from pipeweave.runtime.checkpoint.options import CheckpointOptions

SCHEDULES = ["1f1b", "pipedream", "2bw", "pipeoptim", "spectrain", "wpipe", "avgpipe-auto"]
RANKS, MICROBATCHES, BATCH = 2, 4, 32
ONLINE = "avgpipe-auto"
"""AvgPipe (N = 2) with the online advance controller (wall-clock times): a flush schedule,
no drain; its checkpoints end the controller's windows and save its state."""


def make_job(schedule: str, steps: int) -> Job:
    chunks = 2 if schedule == "wpipe" else 1
    optimizer = (OptimizerFactory("sgd", {"lr": 0.01, "momentum": 0.9}) if schedule == "spectrain"
                 else OptimizerFactory("adam", {"lr": 1e-3}))
    online = schedule == ONLINE
    return Job(plan=Plan.uniform(4, RANKS, chunks=chunks, schedule="avgpipe" if online else schedule,
                                 microbatches=MICROBATCHES, pipelines=2 if online else 1),
               steps=steps, model=BuiltinModel("mlp", dtype="float32", overrides={"hidden": 256}),
               data=BuiltinData("digits", batch_size=BATCH, dtype="float32"), optimizer=optimizer,
               advance=AdvanceOptions() if online else None)


def variant(job: Job, kind: str, every: int, folder: Path) -> Job:
    if kind == "drain" and job.plan.schedule not in ("1f1b", "avgpipe"):  # flush schedules
        options = {**job.plan.schedule_options, "drain": every}
        return dataclasses.replace(job, plan=dataclasses.replace(job.plan, schedule_options=options))
    if kind == "checkpoints":
        return dataclasses.replace(job, checkpoint=CheckpointOptions(directory=str(folder),
                                                                     every=every))
    return job


def training_seconds(results: list[RankResult]) -> float:
    records = [r for result in results for r in result.records]
    return max(end for *_, end in records) - min(start for _, _, start, _ in records)


def measure(schedule: str, steps: int, every: int, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"plain": [], "drain": [], "checkpoints": []}
    stalls: list[float] = []
    for _ in range(repeats):
        for kind in times:
            with tempfile.TemporaryDirectory() as folder:
                results = launch_local(variant(make_job(schedule, steps), kind, every, Path(folder)),
                                       deadline_s=600)
            times[kind].append(training_seconds(results))
            if kind == "checkpoints":
                stalls.append(max(r.checkpoint_stall_s for r in results) / (steps // every))
    plain, drain, written = (statistics.median(times[k]) for k in ("plain", "drain", "checkpoints"))
    return {"plain_s": plain, "drain_s": drain, "checkpoints_s": written,
            "drain_loss_pct": 100 * (drain / plain - 1),
            "checkpoints_loss_pct": 100 * (written / plain - 1),
            "predicted_drain_pct": 100 * (RANKS - 1) / (every * MICROBATCHES
                                                        * (2 if schedule == "wpipe" else 1))
            if schedule not in ("1f1b", ONLINE) else 0.0,
            "stall_ms_per_checkpoint": 1000 * statistics.median(stalls)}


def derive(row: dict[str, float], steps: int, every: int) -> dict[str, float]:
    """Adds ``step_ms``, ``stall_pct`` and ``estimated_loss_pct`` (module docstring)."""
    step_ms = 1000 * min(row["plain_s"], row["drain_s"], row["checkpoints_s"]) / steps
    stall_pct = 100 * row["stall_ms_per_checkpoint"] / (every * step_ms)
    return {**row, "step_ms": step_ms, "stall_pct": stall_pct,
            "estimated_loss_pct": stall_pct + row["predicted_drain_pct"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--derive", type=Path, default=None,
                        help="recompute the derived fields of this result file and exit")
    args = parser.parse_args()
    if args.derive is not None:
        saved = json.loads(args.derive.read_text())
        saved["rows"] = {k: derive(v, saved["steps"], saved["every"]) for k, v in saved["rows"].items()}
        args.derive.write_text(json.dumps(saved, indent=1))
        return
    rows = {}
    for schedule in args.schedules.split(","):
        rows[schedule] = derive(measure(schedule, args.steps, args.every, args.repeats),
                                args.steps, args.every)
        print(schedule, json.dumps({k: round(v, 3) for k, v in rows[schedule].items()}), flush=True)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"steps": args.steps, "every": args.every,
                                             "ranks": RANKS, "microbatches": MICROBATCHES,
                                             "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
