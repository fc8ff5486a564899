"""Benchmark: how long the planners take, at the sizes the issue asks about.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/planning_time.py
        [--repeats 3] [--json-out benchmarks/results/planning_time.json]

Cases (random block costs from a fixed seed; wall time, median of ``--repeats``):

* Algorithm 1 (AutoPipe's min-max DP, ``min_max_partition``): 1,000 blocks onto 64 stages.
* AutoPipe (Algorithm 1 + the simulator-driven search, 1F1B, M = 64): 1,000 blocks on 64
  stages, and a 24-layer GPT at sub-layer granularity (50 blocks) on 8 stages.
* PipeDream's DP with replication (``pipedream_partition``): 100 blocks on 16 workers (one
  level, and two levels of 4 x 4), and PipeDream's VGG-16 profile on 16 workers.
* Scale (``--scale``, one call each): the synthetic 1,000-block profile of ``auto_scale.py``
  asked the way ``pipeweave auto`` asks (auto/partitioning.py): PipeDream straight (a
  pipeline copy of P stages, the copies its data parallelism) for P = 8 ... 512, PipeDream
  with replication on two levels (8 GPUs per machine, P / 8 machines) for P = 64 ... 1,024,
  and AutoPipe (1F1B, M = 2P) for P = 8 ... 256.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from auto_scale import synthetic_profile
from machine_load import timed
from pipeweave.planner import (PlanRequest, Topology, get_method, make_plan, min_max_partition,
                               pipedream_partition)
from pipeweave.profiler import BlockProfile, LinkProfile, Profile

# -- settings ----------------------------------------------------------------------------------
SEED = 0
VGG16 = Path("/work/shared/reference/pipedream-profiles/vgg16.txt")


def random_profile(blocks: int, seed: int = SEED) -> Profile:
    rng = random.Random(seed)
    return Profile(tuple(
        BlockProfile(f"b{i}", rng.uniform(1e-3, 3e-3), rng.uniform(2e-3, 6e-3), rng.uniform(1, 8) * 1e6,
                     rng.uniform(1, 8) * 1e6, rng.choice([0.0, 1e6, 4e7]))
        for i in range(blocks)
    ), model=f"random-{blocks}", link=LinkProfile(1e10, 1e-5))


def gpt_profile(layers: int) -> Profile:
    """GPT-2 1.3B-like costs per sub-layer block (d=2048, T=1024, batch 4, 100 TFLOP/s)."""
    d, seq, vocab, tokens, flops = 2048, 1024, 50257, 4096, 1e14

    def block(name: str, macs: float, params: float, out: float = tokens * d * 2) -> BlockProfile:
        f = 2 * macs * tokens / flops
        return BlockProfile(name, f, 2 * f, out, 4 * out, 2 * params)

    blocks = [block("embed", 4 * d, (vocab + seq) * d)]
    for i in range(layers):
        blocks += [block(f"layer{i}.attn", 4 * d * d + 2 * seq * d, 4 * d * d),
                   block(f"layer{i}.ffn", 8 * d * d, 8 * d * d)]
    blocks.append(block("head", d * vocab, d * vocab, tokens * vocab * 2))
    return Profile(tuple(blocks), model=f"gpt-{layers}l", link=LinkProfile(1e10, 1e-5))


def scale_rows() -> list[dict[str, object]]:
    """One call each of the partition methods as ``pipeweave auto`` makes them at scale."""
    rows: list[dict[str, object]] = []
    profile = synthetic_profile(1000)

    def run(case: str, method: str, request: PlanRequest) -> None:
        started = time.perf_counter()
        partition = get_method(method).run(request)
        seconds = time.perf_counter() - started
        replicas = partition.replicas or (1,) * len(partition.bounds)
        rows.append({"case": case, "blocks": profile.num_blocks, "stages/workers": request.ranks,
                     "seconds": seconds, "note": f"{len(partition.bounds)} stages, "
                     f"most replicas {max(replicas)}"})
        print(f"{case:<44} {request.ranks:>5} {seconds:>9.2f}", flush=True)

    for stages in (8, 64, 128, 256, 512):
        run("PipeDream straight (auto: d < ranks)", "pipedream",
            PlanRequest(profile, stages, microbatches=2 * stages, straight=True))
    for workers in (64, 256, 1024):
        topology = Topology.parse(f"8x1.2e10,{workers // 8}x1.25e9")
        run("PipeDream replicated, 8 x R/8 (auto: d = ranks)", "pipedream",
            PlanRequest(profile, workers, microbatches=2 * workers, topology=topology))
    for stages in (8, 64, 128, 256):
        run("AutoPipe (Alg. 1 + search, 1F1B, M = 2P)", "autopipe",
            PlanRequest(profile, stages, microbatches=2 * stages))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--scale", action="store_true",
                        help="also the 1,000-block cases at 8 ... 1,024 stages (a few minutes)")
    args = parser.parse_args()

    rows: list[dict[str, object]] = []
    big = random_profile(1000)
    rows.append({"case": "Algorithm 1 (min-max DP)", "blocks": 1000, "stages/workers": 64,
                 "seconds": timed(lambda: min_max_partition(big.compute, 64), args.repeats)})
    result = make_plan(PlanRequest(big, 64, microbatches=64), "autopipe")
    rows.append({"case": "AutoPipe (Alg. 1 + search, M=64)", "blocks": 1000, "stages/workers": 64,
                 "seconds": result.planning_seconds,
                 "note": f"{result.details['simulations']} simulations, iteration "
                         f"{result.predicted_iteration_time:.4f} s vs Alg. 1 "
                         f"{result.details['algorithm1_iteration_time']:.4f} s"})
    gpt = gpt_profile(24)
    result = make_plan(PlanRequest(gpt, 8, microbatches=16), "autopipe")
    rows.append({"case": "AutoPipe, GPT 24 layers (sub-layer)", "blocks": gpt.num_blocks,
                 "stages/workers": 8, "seconds": result.planning_seconds,
                 "note": f"balance {result.balance:.4f} (Alg. 1 "
                         f"{result.details['algorithm1_balance']:.4f}), iteration "
                         f"{result.predicted_iteration_time:.4f} s vs "
                         f"{result.details['algorithm1_iteration_time']:.4f} s"})
    mid = random_profile(100)
    for label, topology in (("one level 16x1e9", Topology.single(16, 1e9)),
                            ("two levels 4x1e10,4x1e9", Topology.parse("4x1e10,4x1e9"))):
        seconds = timed(lambda: pipedream_partition(mid.compute, mid.parameter_bytes,
                                                    mid.output_bytes, topology), args.repeats)
        rows.append({"case": f"PipeDream DP with replication, {label}", "blocks": 100,
                     "stages/workers": 16, "seconds": seconds})
    if VGG16.exists():
        vgg = Profile.load(VGG16)
        solution = pipedream_partition(vgg.compute, vgg.parameter_bytes, vgg.output_bytes,
                                       Topology.single(16, 1e9))
        seconds = timed(lambda: pipedream_partition(vgg.compute, vgg.parameter_bytes,
                                                    vgg.output_bytes, Topology.single(16, 1e9)),
                        args.repeats)
        rows.append({"case": "PipeDream DP, VGG-16 profile, 1e9 B/s", "blocks": vgg.num_blocks,
                     "stages/workers": 16, "seconds": seconds,
                     "note": f"replicas {'-'.join(map(str, solution.replicas))}, "
                             f"{solution.time_per_minibatch:.6f} s per minibatch"})

    if args.scale:
        rows += scale_rows()

    print(f"{'case':<44} {'blocks':>6} {'P/R':>5} {'seconds':>9}  note")
    for row in rows:
        print(f"{row['case']:<44} {row['blocks']:>6} {row['stages/workers']:>5} "
              f"{row['seconds']:>9.4f}  {row.get('note', '')}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
