"""What a rank process costs per step over the same job run in-process (issue 25, item b).

``pipeweave train``'s rank process ran 275-330 ms per step on an H100 where the same job
in-process (``run_local``) ran 241-250 ms (``benchmarks/gpu_check.py``'s ``command_line`` and
``pipeweave`` parts, which ran minutes apart). This script runs one job three ways, in turns
(A B C A B C ...) so that drift of the machine hits all three alike:

* ``local``: ``run_local(job)``, the single-process executor;
* ``rank``: :func:`pipeweave.runtime.launch.rank.run_rank` in this process (world size 1,
  an in-memory store, a journal file): the rank's own code (process group, transport,
  per-step journal, timeline) without a new process;
* ``processes``: ``launch_local(job)``: the forked rank process ``pipeweave train`` starts.

Per-step time is read the same way for all three, from the run's own timeline (device time on
a GPU, :mod:`pipeweave.runtime.observation.timeline`): the gaps between iteration ends, median
over the steps after ``--warm``. ``--profile local|rank`` adds a cProfile of that way (one
more run), sorted by own time, to compare what the host does per step.

    PYTHONPATH=src python benchmarks/rank_cost.py --steps 60 --repeats 2   # CPU, gpt-tiny
    PYTHONPATH=src python benchmarks/rank_cost.py --device cuda --steps 12 \\
        --hf-config benchmarks/gpu/llama550m.json --batch-size 16 --seq-len 1024 \\
        --precision bf16-mixed --optimizer adamw --lr 3e-4

The job is the one ``pipeweave train --stages 1`` builds from the same flags (one stage,
1F1B, the timeline on, activations counted on the CPU only, as ``train`` does).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeweave.runtime import (BuiltinModel, Job, OptimizerFactory, Plan, RankResult,
                               launch_local, run_local)
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.runtime.launch.rank import run_rank
from pipeweave.runtime.observation.summary import iteration_end_times

WAYS = ("local", "rank", "processes")


def make_job(args: argparse.Namespace) -> Job:
    """One stage of ``--model`` (or the ``--hf-config`` Llama), as ``pipeweave train`` runs it."""
    overrides: dict[str, Any] = {"seq_len": args.seq_len}
    name = args.model
    if args.hf_config is not None:
        name, overrides["config_file"] = "hf-llama", str(args.hf_config)
    model = BuiltinModel(name, overrides=overrides)
    return Job(plan=Plan.uniform(len(model().blocks), 1, schedule="1f1b",
                                 microbatches=args.microbatches),
               steps=args.steps, model=model, data=model.data(args.batch_size, seq_len=args.seq_len),
               device=args.device, optimizer=OptimizerFactory(args.optimizer, {"lr": args.lr}),
               precision=args.precision, count_activations=args.device == "cpu")


def rank_here(job: Job) -> list[RankResult]:
    """The rank's code path (``run_rank``) in this process, world size 1."""
    with tempfile.TemporaryDirectory() as folder:
        return run_rank(prepare(job), rank=0, world_size=1, local_rank=0, local_world_size=1,
                        store=dist.HashStore(), journal=Path(folder) / "journal")


def step_ms(results: list[RankResult], job: Job, warm: int) -> list[float]:
    """Milliseconds between consecutive iteration ends, after ``warm`` iterations."""
    records = [r for result in results for r in result.records]
    ends = iteration_end_times(records, job.plan.microbatches, job.steps)
    return [1e3 * (b - a) for a, b in zip(ends[warm - 1:], ends[warm:])]


def run_way(way: str, job: Job) -> list[RankResult]:
    runners: dict[str, Callable[[Job], list[RankResult]]] = {
        "local": run_local, "rank": rank_here, "processes": launch_local}
    return runners[way](job)


def profiled(way: str, job: Job, rows: int = 25) -> str:
    profile = cProfile.Profile()
    profile.enable()
    run_way(way, job)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny",
                        help="a built-in model (default gpt-tiny: small, the host's work shows)")
    parser.add_argument("--hf-config", type=Path, default=None,
                        help="a Llama config.json instead of --model")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--precision", default="full")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warm", type=int, default=3, help="iterations left out at the start")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the three ways")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--profile", choices=["local", "rank"], default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.steps <= args.warm + 1:
        parser.error(f"--steps {args.steps} leaves no step after --warm {args.warm}; "
                     f"give --steps {args.warm + 2} or more")
    job = make_job(args)
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in args.ways}
    for round_ in range(args.repeats):
        for way in args.ways:
            started = time.time()
            times = step_ms(run_way(way, job), job, args.warm)
            rows[way].append({"round": round_, "median_ms": statistics.median(times),
                              "min_ms": min(times), "max_ms": max(times),
                              "wall_s": round(time.time() - started, 1)})
            print(f"{way:<10} round {round_}: median {statistics.median(times):8.2f} ms/step "
                  f"(min {min(times):.2f}, max {max(times):.2f})", flush=True)
    result: dict[str, Any] = {"device": args.device, "model": str(args.hf_config or args.model),
                              "steps": args.steps, "warm": args.warm,
                              "threads": torch.get_num_threads(), "ways": rows}
    if args.profile is not None:
        result["profile"] = profiled(args.profile, job)
        print(result["profile"])
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
