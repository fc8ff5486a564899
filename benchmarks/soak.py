"""Soak: every registered schedule trained long, memory and time per step watched (issue 24).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/soak.py
        [--steps 1000] [--short 20] [--middle 200] [--live-steps 200] [--schedules ...]
        [--json-out benchmarks/results/soak.json]

Per schedule, with its defaults (``pipeweave schedules``), GPT-tiny on 2 local ranks:

* ``pipeweave train --schedule S`` with ``--steps`` SHORT, MIDDLE and LONG, as a user runs it
  (one process per rank, activation counting and the timeline on): each rank's peak RSS from
  ``summary.json``, and the long run's median step time over its first and its last tenth
  (after the first 10 steps);
* the same job in one process (``run_local``) for ``--live-steps`` steps: the tensors Python
  reaches and their storages' bytes (:func:`pipeweave.runtime.observation.live.live_tensors`)
  after the optimizer steps that end step 10 and step ``--live-steps`` - 5 (an asynchronous
  schedule drains its pipeline in its last steps).

A flat run has the same live tensors at both ends, step times that do not drift, and the
MIDDLE run's peak within 5 % of the SHORT run's (issue 24's criterion, 200 against 20 steps).
What still grows with ``--steps`` is laid out per step by design: the schedule is data for the
whole run (every rank holds its action list for all steps) and the timeline keeps a record
per action; the table gives that growth in KiB per step (LONG against MIDDLE). The table
prints, the JSON keeps every number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.observation.live import live_tensors_between
from pipeweave.schedules import available_schedules, schedule_defaults

# -- settings -------------------------------------------------------------------------------
STEPS = 1000          # the long CLI run
SHORT = 20            # the short CLI run
MIDDLE = 200          # compared with the short one (issue 24: within 5 %)
LIVE_STEPS = 200      # the in-process run whose live tensors are counted
WARMUP = 10           # steps before the steady state
TAIL = 5              # last steps, left out (an asynchronous schedule drains there)
RANKS = 2
BATCH = 16            # pipeweave train's default batch
FLAT = 1.05           # middle peak / short peak at most this
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "soak.json"


def train(schedule: str, steps: int, folder: Path) -> dict[str, Any]:
    """``pipeweave train`` as a user runs it; its summary.json."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "pipeweave", "train", "--schedule", schedule,
               "--steps", str(steps), "--stages", str(RANKS), "--no-progress",
               "--output-dir", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=60 + 2.0 * steps)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                           else f"exit code {done.returncode}")
    summary: dict[str, Any] = json.loads((folder / "summary.json").read_text())
    return summary


def step_times(ends: list[float]) -> tuple[float, float]:
    """Median step time over the first and the last tenth of the steady state."""
    steps = [b - a for a, b in zip(ends[WARMUP:], ends[WARMUP + 1:])]
    tenth = max(1, len(steps) // 10)
    return statistics.median(steps[:tenth]), statistics.median(steps[-tenth:])


def live_job(schedule: str, steps: int) -> Job:
    own = schedule_defaults(schedule, RANKS, microbatches=4)
    name, kwargs = own.optimizer
    model = BuiltinModel("gpt-tiny")
    return Job(plan=Plan.uniform(len(model().blocks), RANKS, chunks=own.chunks,
                                 schedule=schedule, microbatches=own.microbatches),
               steps=steps, model=model, data=model.data(BATCH),
               optimizer=OptimizerFactory(name, dict(kwargs)), count_activations=True)


def soak(schedule: str, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"schedule": schedule}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            short = train(schedule, args.short, Path(scratch) / "short")
            middle = train(schedule, args.middle, Path(scratch) / "middle")
            began = time.time()
            long = train(schedule, args.steps, Path(scratch) / "long")
            row["long_run_s"] = round(time.time() - began, 1)
        first, last = step_times(long["iteration_end_s"])
        start, end = live_tensors_between(lambda steps: run_local(live_job(schedule, steps)),
                                          first=WARMUP, second=args.live_steps - TAIL,
                                          total=args.live_steps)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        row["error"] = str(error)[:300]
        return row
    row.update(
        peak_rss_short=short["peak_memory_bytes"], peak_rss_middle=middle["peak_memory_bytes"],
        peak_rss_long=long["peak_memory_bytes"],
        peak_ratio=max(b / a for a, b in zip(short["peak_memory_bytes"],
                                             middle["peak_memory_bytes"])),
        kib_per_step=max((c - b) / 1024 / (args.steps - args.middle)
                         for b, c in zip(middle["peak_memory_bytes"],
                                         long["peak_memory_bytes"])),
        step_ms_first=1e3 * first, step_ms_last=1e3 * last,
        samples_per_second=long["samples_per_second"],
        live_tensors=[start.tensors, end.tensors],
        live_storage_bytes=[start.storage_bytes, end.storage_bytes])
    row["flat"] = row["peak_ratio"] <= FLAT and start == end
    return row


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    mib = 2.0 ** 20
    lines = [f"{'schedule':<17} {'peak MiB @' + str(args.short):>14} {'@' + str(args.middle):>6} "
             f"{'ratio':>6} {'@' + str(args.steps):>6} {'KiB/step':>8} {'ms/step first':>13} "
             f"{'last':>6} {'live tensors':>15} {'flat':>5}"]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['schedule']:<17} failed: {row['error']}")
            continue
        lines.append(
            f"{row['schedule']:<17} {max(row['peak_rss_short']) / mib:>14.0f} "
            f"{max(row['peak_rss_middle']) / mib:>6.0f} {row['peak_ratio']:>6.3f} "
            f"{max(row['peak_rss_long']) / mib:>6.0f} {row['kib_per_step']:>8.1f} "
            f"{row['step_ms_first']:>13.1f} {row['step_ms_last']:>6.1f} "
            f"{row['live_tensors'][0]:>7} -> {row['live_tensors'][1]:<5} "
            f"{'yes' if row['flat'] else 'NO':>5}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--short", type=int, default=SHORT)
    parser.add_argument("--middle", type=int, default=MIDDLE)
    parser.add_argument("--live-steps", type=int, default=LIVE_STEPS)
    parser.add_argument("--schedules", nargs="*", default=None)
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if (min(args.short, args.live_steps - TAIL) <= WARMUP
            or not args.short < args.middle < args.steps):
        parser.error(f"--short and --live-steps - {TAIL} must exceed the {WARMUP} warm-up "
                     f"steps, and --short < --middle < --steps")
    names = args.schedules or [info.name for info in available_schedules()]
    rows: list[dict[str, Any]] = []
    for name in names:  # the JSON after every row: a long soak stopped early keeps its rows
        rows.append(soak(name, args))
        print(table(rows[-1:], args).splitlines()[-1], flush=True)
        write(rows, args)
    print(table(rows, args))


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "settings": {"steps": args.steps, "short": args.short, "middle": args.middle,
                     "live_steps": args.live_steps,
                     "warmup": WARMUP, "ranks": RANKS, "model": "gpt-tiny", "batch": BATCH,
                     "flat_ratio": FLAT},
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cores": os.cpu_count()},
        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
