"""Benchmark: pipeweave against torch.distributed.pipelining + FSDP2 / TP, one row per mesh.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/vs_torch_mesh.py
        [--meshes pp2 pp2-dp2 pp2-dp2-full pp2-dp2-grad-op pp2-tp2] [--case gpt]
        [--steps 12] [--repeats 1] [--microbatches M] [--quiet-wait 0]
        [--json-out benchmarks/results/vs_torch_mesh.json]

The model, data, batch, micro-batch count M, SGD, seed, steps and timing are those of
``vs_torch_pipelining.py`` (its ``gpt`` case by default: the built-in GPT d128, 4 layers as
10 blocks, T 64, batch 32, M 4), on 1F1B, on one mesh per row:

    mesh              pipeweave                                 torch
    pp=2              Plan.uniform(10, 2)                        PipelineStage + Schedule1F1B
    pp=2,dp=2         width=2 (the schedule's AR all-reduce)      ... stage under replicate()
    pp=2,dp=2 full    width=2, shard="full"                      ... fully_shard, reshard True
    pp=2,dp=2 grad-op width=2, shard="grad-op"                   ... fully_shard, reshard False
    pp=2,tp=2         tp=2                                       ... parallelize_module (tp)

The torch side (``torch_pipelining_worker.py``, module docstring) runs on
``init_device_mesh("cpu", (pp, dp, tp))``: each stage's blocks and then the stage wrapped
with ``fully_shard`` over the ``dp`` sub-mesh as torchtitan does; the replicated row uses
``torch.distributed._composable.replicate_with_fsdp.replicate`` (FSDP2's replicated twin,
supported by ``PipelineStage``); the tp row splits every block with pipeweave's own
parallelize plan (torch's ``parallelize_module``; the pipelining around it is torch's). Both
sides train the global batch of 32: copy ``k`` takes micro-batches ``k, k+dp, ...``.

Throughput is the batch over the median steady-state iteration (iterations 2..K); a row
shows the median over ``--repeats`` runs per side, the sides alternating. Memory is the peak
RSS of the largest rank (with ``tp``, pipeweave reports tensor-parallel index 0 of each
pipeline rank, torch every process). Both sides must compute the same training: the first
losses agree (same weights and data) and so do the last (same updates), to float32 rounding.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from torch_pipelining_worker import TorchSide, launch as launch_torch  # noqa: E402
from vs_torch_pipelining import (  # noqa: E402
    CASES, Case, Run, case_job, num_blocks, steady_throughput,
)

from pipeweave.runtime import Plan, launch_local  # noqa: E402
from pipeweave.runtime.observation.summary import summarize  # noqa: E402

__all__ = ["Mesh", "MESHES", "mesh_row", "table", "main"]

# -- settings -------------------------------------------------------------------------------
SCHEDULE = "1f1b"
STEPS = 12            # iterations per run; the first is warm-up and is not timed
REPEATS = 1           # runs per side and mesh; the table shows the median
QUIET_BUSY = 0.25     # "idle": other processes use less than this share of the CPUs
PORT_RETRIES = 2      # a run whose loopback port another process took is started again
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "vs_torch_mesh.json"


@dataclass(frozen=True)
class Mesh:
    """A row's mesh: ``pp`` stages, ``dp`` copies held as ``shard`` says, ``tp`` per rank."""

    pp: int
    dp: int = 1
    tp: int = 1
    shard: str = "none"

    @property
    def label(self) -> str:
        axes = ",".join(f"{name}={size}" for name, size in
                        (("pp", self.pp), ("dp", self.dp), ("tp", self.tp)) if size > 1)
        return axes + (f" {self.shard}" if self.shard != "none" else "")

    @property
    def processes(self) -> int:
        return self.pp * self.dp * self.tp


MESHES = {
    "pp2": Mesh(2),
    "pp2-dp2": Mesh(2, dp=2),
    "pp2-dp2-full": Mesh(2, dp=2, shard="full"),
    "pp2-dp2-grad-op": Mesh(2, dp=2, shard="grad-op"),
    "pp2-tp2": Mesh(2, tp=2),
}


def run_pipeweave(case: Case, mesh: Mesh, steps: int) -> Run:
    plan = Plan.uniform(num_blocks(case), mesh.pp, schedule=SCHEDULE,
                        microbatches=case.microbatches, width=mesh.dp, shard=mesh.shard,
                        tp=mesh.tp)
    results = launch_local(case_job(case, plan, steps))
    summary = summarize(results, schedule=SCHEDULE, steps=steps, batch_size=case.batch_size,
                        microbatches=case.microbatches)
    ends = summary.iteration_end_s
    return Run(steady_throughput(ends, case.batch_size), summary.peak_memory_bytes,
               summary.losses, ends)


def run_torch(case: Case, mesh: Mesh, steps: int) -> Run:
    side = TorchSide(model=case.model, overrides=case.overrides,
                     stages=Plan.uniform(num_blocks(case), mesh.pp).stages, schedule=SCHEDULE,
                     microbatches=case.microbatches, batch_size=case.batch_size,
                     seq_len=case.seq_len, dataset=case.dataset, steps=steps, lr=case.lr,
                     dp=mesh.dp, shard=mesh.shard, tp=mesh.tp)
    results = launch_torch(side)
    ends = [max(r.iteration_end_s[k] for r in results) for k in range(steps)]
    # Every copy's last stage (and its tp processes) report their micro-batches' mean loss;
    # copies train equally many micro-batches, so the mean of theirs is the batch's.
    losses = [statistics.fmean(column) for column in zip(*(r.losses for r in results if r.losses))]
    return Run(steady_throughput(ends, case.batch_size), [r.peak_memory_bytes for r in results],
               losses, ends)


def _side(runs: list[Run]) -> dict[str, Any]:
    return {
        "samples_per_second": statistics.median(r.samples_per_second for r in runs),
        "samples_per_second_runs": [r.samples_per_second for r in runs],
        "busy_before_runs": [round(r.busy_before, 3) for r in runs],
        "foreign_load_runs": [round(r.foreign, 3) for r in runs],
        "peak_rss_bytes": max(max(r.peak_rss_bytes) for r in runs),
        "losses": runs[0].losses,
    }


def mesh_row(case: Case, mesh: Mesh, runs: dict[str, list[Run]]) -> dict[str, Any]:
    """One table row from both sides' runs: medians, the ratios and the training check."""
    pw, th = _side(runs["pipeweave"]), _side(runs["torch"])
    first_gap = abs(pw["losses"][0] - th["losses"][0])
    last_gap = abs(pw["losses"][-1] - th["losses"][-1])
    return {
        "case": case.label, "schedule": SCHEDULE, "mesh": mesh.label, "pp": mesh.pp,
        "dp": mesh.dp, "tp": mesh.tp, "shard": mesh.shard, "processes": mesh.processes,
        "pipeweave": pw, "torch": th,
        "throughput_ratio": pw["samples_per_second"] / th["samples_per_second"],
        "peak_rss_ratio": pw["peak_rss_bytes"] / th["peak_rss_bytes"],
        "first_loss_gap": first_gap, "last_loss_gap": last_gap,
        "same_training": bool(first_gap <= 1e-3 * abs(th["losses"][0])
                              and last_gap <= 1e-3 * abs(th["losses"][-1])
                              and pw["losses"][-1] < pw["losses"][0]),
    }


def _run_once(runner: Callable[[Case, Mesh, int], Run], case: Case, mesh: Mesh,
              steps: int) -> Run:
    """``runner``'s run, started again (up to ``PORT_RETRIES`` times) when another process
    took the free loopback port between choosing it and listening on it (a shared machine)."""
    for attempt in range(PORT_RETRIES + 1):
        try:
            return runner(case, mesh, steps)
        except Exception as error:  # torch's spawn wraps the rank's error in its message
            if "EADDRINUSE" not in str(error) or attempt == PORT_RETRIES:
                raise
            print(f"  {mesh.label}: the port was taken, starting again", flush=True)
    raise AssertionError("unreachable")


def compare(case: Case, mesh: Mesh, steps: int, repeats: int,
            quiet_wait_s: float) -> dict[str, Any]:
    """Alternate the two sides ``repeats`` times (waiting for a quiet machine if asked)."""
    runs: dict[str, list[Run]] = {"pipeweave": [], "torch": []}
    for repeat in range(repeats):
        order = ("pipeweave", "torch") if repeat % 2 == 0 else ("torch", "pipeweave")
        for side in order:
            busy = wait_for_quiet(quiet_wait_s, QUIET_BUSY) if quiet_wait_s > 0 else 0.0
            with ForeignLoad() as load:
                run = _run_once(run_pipeweave if side == "pipeweave" else run_torch,
                                case, mesh, steps)
            run.busy_before, run.foreign = busy, load.share
            runs[side].append(run)
    return mesh_row(case, mesh, runs)


def table(rows: list[dict[str, Any]]) -> str:
    mib = 2**20
    head = (f"{'mesh':<18} {'procs':>5} | {'pipeweave':>9} {'torch':>9} {'ratio':>6} | "
            f"{'pw RSS':>7} {'th RSS':>7} | {'loss1 pw':>9} {'loss1 th':>9} "
            f"{'lossK pw':>9} {'lossK th':>9}")
    lines = [head, " " * 26 + "samples/s (median)" + " " * 5 + "max-rank MiB", "-" * len(head)]
    for r in rows:
        pw, th = r["pipeweave"], r["torch"]
        lines.append(
            f"{r['mesh']:<18} {r['processes']:>5} | {pw['samples_per_second']:>9.1f} "
            f"{th['samples_per_second']:>9.1f} {r['throughput_ratio']:>5.2f}x | "
            f"{pw['peak_rss_bytes'] / mib:>7.0f} {th['peak_rss_bytes'] / mib:>7.0f} | "
            f"{pw['losses'][0]:>9.4f} {th['losses'][0]:>9.4f} "
            f"{pw['losses'][-1]:>9.4f} {th['losses'][-1]:>9.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", nargs="+", default=list(MESHES), choices=list(MESHES))
    parser.add_argument("--case", default="gpt", choices=list(CASES))
    parser.add_argument("--microbatches", type=int, default=None,
                        help="M per iteration (default: the case's); torch's 1F1B needs "
                             "M / dp >= pp")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="seconds to wait for an idle machine before each run (0: don't)")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: need >= 3 (one warm-up plus two timed iterations)")
    case = CASES[args.case]
    if args.microbatches is not None:
        case = dataclasses.replace(case, microbatches=args.microbatches)
    load_before = os.getloadavg()
    rows = []
    for name in args.meshes:
        started = time.perf_counter()
        rows.append(compare(case, MESHES[name], args.steps, args.repeats, args.quiet_wait))
        print(f"  {name}: {rows[-1]['throughput_ratio']:.2f}x "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    print(table(rows))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "settings": {"steps": args.steps, "repeats": args.repeats, "schedule": SCHEDULE,
                     "threads_per_rank": 1, "backend": "gloo", "case": vars(case)},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {args.json_out}")
    return rows


if __name__ == "__main__":
    main()
