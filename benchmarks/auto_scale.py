"""Benchmark: ``pipeweave auto --profile`` at scale (issue 16, "planning scale").

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/auto_scale.py
        [--blocks 1000] [--ranks 1024] [--topology 8x1.2e10,128x1.25e9]
        [--methods all] [--time-limit 0] [--give-up 600]
        [--json-out benchmarks/results/auto_scale.json]
    ... benchmarks/auto_scale.py --quick       # 200 blocks on 64 ranks

A synthetic profile of ``--blocks`` GPT-like sub-layer blocks (a ~500-layer decoder, d=2048,
micro-batch of 4 sequences of 1,024 tokens, 100 TFLOP/s, fp16 activations) is written to a
temporary file and searched by the command itself (``pipeweave auto --profile FILE --ranks R
--topology ... --json``) on a two-level topology (8 GPUs per machine on NVLink-class links,
128 machines on 10 Gb/s-class Ethernet). Prints the wall time (the issue asks for under 60 s
on this machine) and the candidate counts: considered, invalid, pruned (by time, by memory),
simulated, duplicates, and unexamined: ``--time-limit`` (default ``0``: none, the exact
search; every partition method by default, ``--methods``) stops the search there and takes the best so far, the candidates not reached (the weakest bounds, since
they go best bound first) counted as unexamined, and those whose estimated cost did not fit in
the time left (auto/budget.py) counted as over_budget; and the winner.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeweave.profiler import BlockProfile, LinkProfile, Profile

D, SEQ, VOCAB, MICROBATCH, FLOPS = 2048, 1024, 50257, 4, 1e14


def synthetic_profile(blocks: int) -> Profile:
    """``blocks`` blocks: embedding, (blocks - 2) / 2 attention + FFN layers, head."""
    tokens = MICROBATCH * SEQ

    def block(name: str, macs: float, params: float, out: float = tokens * D * 2) -> BlockProfile:
        forward = 2 * macs * tokens / FLOPS
        return BlockProfile(name, forward, 2 * forward, out, 4 * out, 2 * params, 8 * params,
                            update=params * 2 / 1e12)

    layers = (blocks - 2) // 2
    out = [block("embed", 4 * D, (VOCAB + SEQ) * D)]
    for i in range(layers):
        out += [block(f"layer{i}.attn", 4 * D * D + 2 * SEQ * D, 4 * D * D),
                block(f"layer{i}.ffn", 8 * D * D, 8 * D * D)]
    while len(out) < blocks - 1:
        out.append(block(f"extra{len(out)}.ffn", 8 * D * D, 8 * D * D))
    out.append(block("head", D * VOCAB, D * VOCAB, tokens * VOCAB * 2))
    return Profile(tuple(out), model=f"synthetic-{blocks}", batch_size=MICROBATCH,
                   device="synthetic", source="synthetic", link=LinkProfile(1.2e10, 5e-6))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--topology", default="8x1.2e10,128x1.25e9")
    parser.add_argument("--memory-limit", default="80GB")
    parser.add_argument("--methods", default="all",
                        help="partition methods searched (pipeweave auto --methods); 'all' "
                             "(the default) searches every registered method, AutoPipe and "
                             "PipeDream included (issue 29)")
    parser.add_argument("--time-limit", type=float, default=0.0,
                        help="seconds the search may take (0, the default: search everything, "
                             "the exact search issue 29 asks for)")
    parser.add_argument("--give-up", type=float, default=None,
                        help="stop the command after this many seconds of wall time and "
                             "record that it did not finish, with the last progress line")
    parser.add_argument("--quick", action="store_true",
                        help="200 blocks on 64 ranks (8x1.2e10,8x1.25e9): checks the script runs")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.ranks, args.topology = 200, 64, "8x1.2e10,8x1.25e9"

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json"
        synthetic_profile(args.blocks).save(path)
        command = [sys.executable, "-m", "pipeweave", "auto", "--profile", str(path),
                   "--ranks", str(args.ranks), "--topology", args.topology,
                   "--memory-limit", args.memory_limit, "--shared-cores", "none", "--json",
                   "--top", "5", "--out", str(Path(folder) / "plan.json"),
                   "--plot", str(Path(folder) / "front.png")]
        if args.methods != "all":
            command += ["--methods", args.methods]
        if args.time_limit > 0:
            command += ["--time-limit", str(args.time_limit)]
        print("$ pipeweave " + " ".join(command[3:]), flush=True)
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.give_up)
        except subprocess.TimeoutExpired as expired:
            _gave_up(args, time.perf_counter() - started, expired)
            return
        seconds = time.perf_counter() - started
    cpu = _child_cpu()
    if done.returncode != 0:
        sys.exit(f"pipeweave auto failed:\n{done.stderr}")
    report = json.loads(done.stdout)
    winner = report["winner"]
    counts = {key: report[key] for key in ("considered", "invalid", "pruned", "pruned_time",
                                           "pruned_memory", "simulated", "duplicates",
                                           "unexamined", "over_budget", "over_memory_limit")}
    print(f"{args.blocks} blocks on {args.ranks} ranks ({args.topology}): {seconds:.1f} s wall "
          f"(search {report['search_seconds']:.1f} s; {cpu:.1f} s CPU), under 60 s: "
          f"{seconds < 60}")
    print("  ".join(f"{key} {value}" for key, value in counts.items()))
    print(f"winner: {_winner_line(winner)}")
    _record(args, {"finished": True, "wall_seconds": seconds, "cpu_seconds": cpu,
                   "search_seconds": report["search_seconds"], **counts,
                   "winner": {k: v for k, v in winner.items() if k != "plan"}})


def _winner_line(winner: dict[str, Any]) -> str:
    return (f"{winner['schedule']} d={winner['depth']} w={winner['width']} "
            f"v={winner['chunks']} M={winner['microbatches']} N={winner['pipelines']} "
            f"recompute={winner['recompute']} method={winner['method']}: "
            f"{winner['predicted_samples_per_second']:.1f} samples/s, peak "
            f"{max(winner['predicted_peak_memory_bytes']) / 1e9:.1f} GB")


def _record(args: argparse.Namespace, outcome: dict[str, object]) -> None:
    """Write the run's settings and ``outcome`` to ``--json-out`` (if given)."""
    if args.json_out is None:
        return
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "blocks": args.blocks, "ranks": args.ranks, "topology": args.topology,
        "memory_limit": args.memory_limit, "time_limit": args.time_limit,
        "methods": args.methods, **outcome}, indent=2) + "\n")


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished command: on a shared machine the wall time
    measures the load as much as the search."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _gave_up(args: argparse.Namespace, seconds: float,
             expired: subprocess.TimeoutExpired) -> None:
    """Print and record a run stopped by ``--give-up``: how far it got, by its progress."""
    err = expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else "(no progress line)"
    cpu = _child_cpu()
    print(f"{args.blocks} blocks on {args.ranks} ranks ({args.topology}): stopped after "
          f"{seconds:.1f} s wall ({cpu:.1f} s CPU) (--give-up), not finished; last progress: "
          f"{last}")
    _record(args, {"finished": False, "wall_seconds": seconds, "cpu_seconds": cpu,
                   "last_progress": last})


if __name__ == "__main__":
    main()
