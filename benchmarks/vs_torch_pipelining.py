"""Benchmark: pipeweave's runtime against torch.distributed.pipelining, like for like.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/vs_torch_pipelining.py
        [--repeats 3] [--steps 12] [--ranks 2 4] [--schedules gpipe 1f1b] [--cases gpt mlp]
        [--quiet-wait 30] [--json-out benchmarks/results/vs_torch_pipelining.json]

Both sides train the SAME model (pipeweave's built-in GPT, and the MLP on digits), cut into
the SAME block ranges (``Plan.uniform``), with the same batch size, micro-batch count M, SGD
learning rate, steps, seed and data (batch k of the same stream for iteration k). Each rank
is one process started by ``forkserver`` on a loopback port with gloo and ONE intra-op
thread; process start-up and the process-group rendezvous happen before the timed window.

    pipeweave: launch_local(Job(Plan.uniform(...), ...))       (this file)
    torch:     PipelineStage(nn.Sequential(blocks)) + ScheduleGPipe / Schedule1F1B
                                                              (torch_pipelining_worker.py)

Throughput is steady state: batch size over the median iteration time of iterations 2..K,
where iteration k runs from the end of iteration k-1 to the end of iteration k and "end" is
the latest rank's (pipeweave: its measured timeline; torch: wall clock after each rank's
optimizer step). The table shows the median over ``--repeats`` runs per side, the sides
alternating run by run. "bound" is the throughput GPipe/1F1B allow at the forward/backward
times pipeweave measured in the same runs (:func:`schedule_bound_s`): neither side can pass
it, so it shows how much headroom is left. Memory is each rank's peak RSS (``ru_maxrss``).
Both sides must train: the first iteration's loss agrees (same initial weights, same data)
and the loss goes down.

On a shared machine, other jobs are the largest error. Each run waits (up to
``--quiet-wait`` seconds) for the CPUs to be mostly idle, and a run that started on a quiet
machine is redone (up to ``RETRIES`` times) if processes outside the benchmark took more than
``MAX_FOREIGN`` of the CPUs meanwhile. The JSON records, for every run, the busy share
before it, the foreign share during it and the attempts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from torch_pipelining_worker import TorchSide, launch as launch_torch  # noqa: E402

from pipeweave.ir import parse_action  # noqa: E402
from pipeweave.models import build_model  # noqa: E402
from pipeweave.runtime import (  # noqa: E402
    BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local,
)
from pipeweave.runtime.observation.summary import summarize  # noqa: E402

# -- settings -------------------------------------------------------------------------------
STEPS = 12            # iterations per run; the first is warm-up and is not timed
REPEATS = 3           # runs per side and configuration; the table shows the median
QUIET_WAIT_S = 30.0   # before each run, wait up to this long for other processes to go idle
QUIET_BUSY = 0.25     # "idle": other processes use less than this share of the CPUs
MAX_FOREIGN = 0.10    # a run during which other processes used more of the CPUs is redone
RETRIES = 3           # ... at most this many times (the last attempt is kept either way)
RANKS = (2, 4)        # pipeline depths (one process per stage)
SCHEDULES = ("gpipe", "1f1b")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "vs_torch_pipelining.json"


@dataclass(frozen=True)
class Case:
    """A model, its data and the batch geometry used on both sides."""

    label: str
    model: str
    overrides: dict[str, Any]
    dataset: str
    seq_len: int | None
    batch_size: int
    microbatches: int
    lr: float
    """Plain SGD learning rate (the same on both sides)."""


CASES = {
    # 10 blocks: embed, (attn, ffn) x 4, head. d_model 128, seq 64: each micro-batch of 8
    # sequences is ~1 ms-scale matmuls per block, so compute outweighs a message's fixed cost.
    "gpt": Case("gpt d128 L4 T64", "gpt-tiny",
                {"d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512, "seq_len": 64},
                dataset="stdlib-bytes", seq_len=64, batch_size=32, microbatches=4, lr=0.01),
    # 4 blocks of Linear(128)+ReLU on 8x8 digits: tiny compute, so per-action overhead shows.
    "mlp": Case("mlp digits", "mlp", {}, dataset="digits", seq_len=None, batch_size=64,
                microbatches=4, lr=0.1),
    # Hugging Face's GPT2LMHeadModel (pipeweave.hf, untied) at the "gpt" case's shape, split
    # into attention and MLP halves: 10 blocks, HF's own loss. torch's side runs the same
    # blocks through PipelineStage's manual API (no tracing).
    "hf-gpt2": Case("HF GPT-2 d128 L4 T64", "hf-gpt2",
                    {"d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512, "seq_len": 64,
                     "sublayer": True},
                    dataset="stdlib-bytes-labels", seq_len=64, batch_size=32, microbatches=4,
                    lr=0.01),
    # For the smoke test (tests/benchmarks): 6 blocks of a d_model 32 GPT, seconds per run.
    "tiny": Case("gpt d32 L2 T16", "gpt-tiny",
                 {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "seq_len": 16},
                 dataset="stdlib-bytes", seq_len=16, batch_size=8, microbatches=2, lr=0.05),
}
DEFAULT_CASES = ("gpt", "mlp")


@dataclass
class Run:
    """One side's result for one run: steady-state throughput, memory and losses."""

    samples_per_second: float
    peak_rss_bytes: list[int]
    losses: list[float]
    iteration_end_s: list[float] = field(default_factory=list)
    bound: float = 0.0
    """Samples/s the schedule allows at this run's measured compute (pipeweave runs only)."""
    busy_before: float = 0.0
    """Share of the CPUs other processes used just before the run."""
    foreign: float = 0.0
    """Share of the CPUs processes outside the benchmark used during the run."""
    attempts: int = 1


def steady_throughput(ends: list[float], batch_size: int) -> float:
    """Samples/s of the median iteration after the first (warm-up excluded).

    Iteration k's time is ``ends[k] - ends[k-1]`` (k >= 1); the median shrugs off the odd
    iteration slowed by another process on a shared machine, which a mean over the window
    would absorb.
    """
    durations = [b - a for a, b in zip(ends, ends[1:])]
    median = statistics.median(durations)
    return batch_size / median if median > 0 else 0.0


def num_blocks(case: Case) -> int:
    return len(build_model(case.model, **case.overrides).blocks)


def case_job(case: Case, plan: Plan, steps: int) -> Job:
    """The pipeweave job of ``case`` under ``plan``: its model, data and plain SGD."""
    return Job(plan=plan, steps=steps, model=BuiltinModel(case.model, overrides=case.overrides),
               data=BuiltinData(case.dataset, batch_size=case.batch_size, seq_len=case.seq_len),
               optimizer=OptimizerFactory("sgd", {"lr": case.lr}), timeout_s=120.0)


def run_pipeweave(case: Case, schedule: str, ranks: int, steps: int) -> Run:
    plan = Plan.uniform(num_blocks(case), ranks, schedule=schedule, microbatches=case.microbatches)
    results = launch_local(case_job(case, plan, steps))
    summary = summarize(results, schedule=schedule, steps=steps, batch_size=case.batch_size,
                        microbatches=case.microbatches)
    ends = summary.iteration_end_s
    run = Run(steady_throughput(ends, case.batch_size), summary.peak_memory_bytes,
              summary.losses, ends)
    run.bound = case.batch_size / schedule_bound_s(results, case.microbatches, ends)
    return run


def schedule_bound_s(results: list[Any], microbatches: int, ends: list[float]) -> float:
    """Iteration time GPipe/1F1B cannot beat, given this run's measured compute.

    With per-stage forward and backward times f_s, b_s (medians over the timed iterations),
    a flush schedule's iteration takes at least ``sum_s (f_s + b_s) + (M - 1) max_s (f_s +
    b_s)``: the slowest stage works through M micro-batches while the pipeline fills and
    drains around it (GPipe, Huang et al. 2019, section 2.3). Messages, updates and every
    other overhead come on top, on either side of the comparison.
    """
    per_stage: list[float] = []
    for result in results:
        durations: dict[str, list[float]] = {"F": [], "B": []}
        for _, text, start, end in result.records:
            action = parse_action(text)
            if action.op.value in durations and start >= ends[0] and end <= ends[-1]:
                durations[action.op.value].append(end - start)
        per_stage.append(sum(statistics.median(d) for d in durations.values() if d))
    return sum(per_stage) + (microbatches - 1) * max(per_stage)


def run_torch(case: Case, schedule: str, ranks: int, steps: int,
              stages: tuple[tuple[int, int], ...] | None = None) -> Run:
    """``stages``: block range per rank (default ``Plan.uniform``'s, as pipeweave's here)."""
    if stages is None:
        stages = Plan.uniform(num_blocks(case), ranks).stages
    side = TorchSide(model=case.model, overrides=case.overrides, stages=stages,
                     schedule=schedule, microbatches=case.microbatches,
                     batch_size=case.batch_size, seq_len=case.seq_len, dataset=case.dataset,
                     steps=steps, lr=case.lr)
    results = launch_torch(side)
    ends = [max(r.iteration_end_s[k] for r in results) for k in range(steps)]
    return Run(steady_throughput(ends, case.batch_size), [r.peak_memory_bytes for r in results],
               results[-1].losses, ends)


def compare(case: Case, schedule: str, ranks: int, steps: int, repeats: int,
            quiet_wait_s: float = QUIET_WAIT_S) -> dict[str, Any]:
    """Alternate the two sides ``repeats`` times; medians, memory and a training check."""
    runs: dict[str, list[Run]] = {"pipeweave": [], "torch": []}
    for repeat in range(repeats):
        order = ("pipeweave", "torch") if repeat % 2 == 0 else ("torch", "pipeweave")
        for side in order:
            runner = run_pipeweave if side == "pipeweave" else run_torch
            for attempt in range(1, RETRIES + 2 if quiet_wait_s > 0 else 2):
                busy = wait_for_quiet(quiet_wait_s, QUIET_BUSY) if quiet_wait_s > 0 else 0.0
                with ForeignLoad() as load:
                    run = runner(case, schedule, ranks, steps)
                run.busy_before, run.foreign, run.attempts = busy, load.share, attempt
                if load.share <= MAX_FOREIGN or busy > QUIET_BUSY:
                    break  # clean, or the machine never went quiet: retrying won't help
            runs[side].append(run)
    row: dict[str, Any] = {"case": case.label, "schedule": schedule, "ranks": ranks}
    for side, side_runs in runs.items():
        rss = [max(r.peak_rss_bytes[rank] for r in side_runs) for rank in range(ranks)]
        row[side] = {
            "samples_per_second": statistics.median(r.samples_per_second for r in side_runs),
            "samples_per_second_runs": [r.samples_per_second for r in side_runs],
            "busy_before_runs": [round(r.busy_before, 3) for r in side_runs],
            "foreign_load_runs": [round(r.foreign, 3) for r in side_runs],
            "attempts_runs": [r.attempts for r in side_runs],
            "peak_rss_bytes": rss,
            "losses": side_runs[0].losses,
        }
    pw, th = row["pipeweave"], row["torch"]
    row["throughput_ratio"] = pw["samples_per_second"] / th["samples_per_second"]
    row["schedule_bound"] = statistics.median(r.bound for r in runs["pipeweave"])
    row["peak_rss_ratio"] = max(pw["peak_rss_bytes"]) / max(th["peak_rss_bytes"])
    first_gap = abs(pw["losses"][0] - th["losses"][0])
    row["first_loss_gap"] = first_gap
    row["both_train"] = bool(first_gap < 1e-3 * abs(th["losses"][0])
                             and pw["losses"][-1] < pw["losses"][0]
                             and th["losses"][-1] < th["losses"][0])
    return row


def table(rows: list[dict[str, Any]]) -> str:
    mib = 2**20
    head = (f"{'case':<16} {'schedule':<6} {'ranks':>5} | {'pipeweave':>9} {'torch':>9} "
            f"{'ratio':>6} {'bound':>9} | {'pw RSS':>7} {'th RSS':>7} {'ratio':>6} | "
            f"{'loss1 pw':>9} {'loss1 th':>9} {'lossK pw':>9} {'lossK th':>9}")
    lines = [head, " " * 31 + "samples/s (median of runs)" + " " * 15 + "max-rank peak RSS MiB",
             "-" * len(head)]
    for r in rows:
        pw, th = r["pipeweave"], r["torch"]
        lines.append(
            f"{r['case']:<16} {r['schedule']:<6} {r['ranks']:>5} | "
            f"{pw['samples_per_second']:>9.1f} {th['samples_per_second']:>9.1f} "
            f"{r['throughput_ratio']:>5.2f}x {r['schedule_bound']:>9.1f} | "
            f"{max(pw['peak_rss_bytes']) / mib:>7.0f} {max(th['peak_rss_bytes']) / mib:>7.0f} "
            f"{r['peak_rss_ratio']:>5.2f}x | {pw['losses'][0]:>9.4f} {th['losses'][0]:>9.4f} "
            f"{pw['losses'][-1]:>9.4f} {th['losses'][-1]:>9.4f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S,
                        help="seconds to wait for an idle machine before each run (0: don't)")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: need >= 3 (one warm-up plus two timed iterations)")
    cases = CASES
    rows = []
    for name in args.cases:
        for ranks in args.ranks:
            for schedule in args.schedules:
                started = time.perf_counter()
                rows.append(compare(cases[name], schedule, ranks, args.steps, args.repeats,
                                    args.quiet_wait))
                print(f"  {name} {schedule} {ranks} ranks: {rows[-1]['throughput_ratio']:.2f}x "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    print(table(rows))
    write_results(args.json_out, args, rows)
    return rows


def write_results(path: Path, args: argparse.Namespace, rows: list[dict[str, Any]],
                  cases: dict[str, Case] | None = None) -> None:
    """``rows`` with the run's settings (``args.steps/repeats/cases``) and the machine."""
    known = CASES if cases is None else cases
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "settings": {"steps": args.steps, "repeats": args.repeats,
                     "threads_per_rank": 1, "backend": "gloo",
                     "cases": {n: vars(known[n]) for n in args.cases}},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
