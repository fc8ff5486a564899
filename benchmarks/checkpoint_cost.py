"""Benchmark: what a checkpoint costs — write, load and size against the parameter bytes, and
how long training stalls for one.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_cost.py
        [--sizes 1,8,32,128] [--repeats 3] [--json-out benchmarks/results/checkpoint_cost.json]

For each size, an MLP (float32, 3 hidden layers of width h chosen for the parameter bytes) on
2 ranks (1F1B, M = 4, batch 16, Adam) is checkpointed:

* copy params — cloning every parameter once: the goal's yardstick (issue: "writing does not
  stall training by more than the time to copy the parameters once");
* write — one full checkpoint as the writer threads do it: serialise parameters and Adam state
  (so ~3x the parameter bytes), sha256, fsync, rename, each rank's record, the manifest;
* load — verify every shard's sha256 and load it (``weights_only``) into the model's tensors;
* stall — measured in real training (single-process executor, a checkpoint after every
  step): time the training thread spends in checkpoint hooks (hand-off to the writer, and the
  fence before the next update), per checkpoint, worst rank;
* stall at a sustainable rate — the same with a checkpoint every k steps, k chosen so that k
  steps outlast 1.5 writes (3 checkpoints): what the goal is about. With a checkpoint after
  every step and a disk slower than a step, the first stall also counts the wait for the
  disk (at most ``MAX_PENDING_WRITES`` checkpoints are queued per rank);
* overhead — training time (first action to last, as recorded) with a checkpoint after every
  step minus without, per checkpoint: what checkpoints cost throughput (the final write, which
  the run waits for at its end, is not included).

Median of ``--repeats`` for write/load/copy. Numbers depend on the disk and the page cache;
fsync makes "write" honest about durability.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from machine_load import timed
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult,
                               run_local)
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import StoredCheckpoint, finalize, step_folder, write_shard

# -- settings ----------------------------------------------------------------------------------
SIZES_MIB = (1, 8, 32, 128)
"""Parameter bytes of the model, MiB."""
RANKS, MICROBATCHES, BATCH, STEPS = 2, 4, 16, 6


def hidden_for(mib: float) -> int:
    """Width h with 4 bytes x (64h + 2h^2 + 10h + 3h + 10) ≈ ``mib`` MiB (3 hidden layers)."""
    target = mib * 2**20 / 4
    return max(8, int((-77 + (77**2 + 8 * target) ** 0.5) / 4))


def make_job(hidden: int) -> Job:
    return Job(plan=Plan.uniform(4, RANKS, schedule="1f1b", microbatches=MICROBATCHES),
               steps=STEPS, model=BuiltinModel("mlp", dtype="float32", overrides={"hidden": hidden}),
               data=BuiltinData("digits", batch_size=BATCH, dtype="float32"),
               optimizer=OptimizerFactory("adam", {"lr": 1e-3}))


def training_seconds(results: list[RankResult]) -> float:
    """From the first recorded action to the last, over all ranks."""
    records = [r for result in results for r in result.records]
    return max(end for *_, end in records) - min(start for _, _, start, _ in records)


def rank_payloads(job: Job) -> list[tuple[dict, dict]]:
    """Per rank: a shard payload like a real one (parameters, Adam moments) and its record."""
    spec = job.model().materialized()  # real values (the factory builds on meta)
    out = []
    for start, end in job.plan.stages:
        params = {f"{b}.{n}": p.detach() for b in range(start, end)
                  for n, p in spec.blocks[b].named_parameters()}
        optimizer = {n: {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(p),
                         "exp_avg_sq": torch.rand_like(p)} for n, p in params.items()}
        payload = {"parameters": params, "optimizer": optimizer,
                   "rng": {"cpu": torch.get_rng_state()}}
        record = {"run_id": "bench", "step": 1, "blocks": list(range(start, end)),
                  "has_losses": False, "common": {"plan": job.plan.to_json()},
                  "parameters": {n: {"shape": list(p.shape), "dtype": "float32"}
                                 for n, p in params.items()}}
        out.append((payload, record))
    return out


def measure(mib: float, repeats: int, root: Path) -> dict[str, float]:
    job = make_job(hidden_for(mib))
    spec = job.model().materialized()  # real values (the factory builds on meta)
    params = [p for block in spec.blocks for p in block.parameters()]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    copy_s = timed(lambda: [p.detach().clone() for p in params], repeats)

    payloads = rank_payloads(job)
    folders: list[Path] = []

    def write() -> None:
        folder = step_folder(root, len(folders) + 1, "bench")
        for rank, (payload, record) in enumerate(payloads):
            write_shard(folder, rank, payload, record)
        assert finalize(folder, RANKS)
        folders.append(folder)

    write_s = timed(write, repeats)
    size = sum(f.stat().st_size for f in folders[-1].iterdir())

    def load() -> None:
        stored = StoredCheckpoint(folders[-1], verify=True)
        for shard, (payload, _) in zip(stored.shards, payloads):
            for name, tensor in stored.load(shard)["parameters"].items():
                payload["parameters"][name].copy_(tensor)

    load_s = timed(load, repeats)

    run_local(dataclasses.replace(job, steps=1))  # warm-up: data, allocator, thread pools
    plain = run_local(job)
    ckpt_dir = root / "run"
    checkpointed = run_local(dataclasses.replace(
        job, checkpoint=CheckpointOptions(directory=str(ckpt_dir), every=1)))
    stall_s = max(r.checkpoint_stall_s for r in checkpointed) / STEPS
    step_s = training_seconds(plain) / STEPS
    overhead_s = (training_seconds(checkpointed) - training_seconds(plain)) / (STEPS - 1)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    # At a rate the disk sustains: a checkpoint every k steps, k steps outlasting 1.5 writes.
    every = max(1, math.ceil(1.5 * write_s / step_s))
    sustained = run_local(dataclasses.replace(
        job, steps=3 * every, checkpoint=CheckpointOptions(directory=str(ckpt_dir), every=every)))
    sustained_stall_s = max(r.checkpoint_stall_s for r in sustained) / 3
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return {"param_mib": param_bytes / 2**20, "disk_mib": size / 2**20, "copy_ms": copy_s * 1e3,
            "write_ms": write_s * 1e3, "load_ms": load_s * 1e3, "stall_ms": stall_s * 1e3,
            "step_ms": step_s * 1e3, "overhead_ms": overhead_s * 1e3,
            "sustained_every": every, "sustained_stall_ms": sustained_stall_s * 1e3,
            "write_mib_per_s": size / 2**20 / write_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES_MIB),
                        help="parameter MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipeweave-ckpt-bench-") as tmp:
        for mib in (float(s) for s in args.sizes.split(",")):
            rows.append(measure(mib, args.repeats, Path(tmp)))
    header = (f"{'params MiB':>10} {'on disk MiB':>11} {'copy params ms':>14} {'write ms':>9} "
              f"{'MiB/s':>7} {'load ms':>8} {'stall/ckpt ms':>13} {'step ms':>8} "
              f"{'overhead ms':>11} | {'every k':>7} {'stall/ckpt ms':>13}  stall <= copy")
    print(header)
    for r in rows:
        print(f"{r['param_mib']:>10.1f} {r['disk_mib']:>11.1f} {r['copy_ms']:>14.2f} "
              f"{r['write_ms']:>9.1f} {r['write_mib_per_s']:>7.0f} {r['load_ms']:>8.1f} "
              f"{r['stall_ms']:>13.2f} {r['step_ms']:>8.1f} {r['overhead_ms']:>11.1f} | "
              f"{r['sustained_every']:>7} {r['sustained_stall_ms']:>13.2f}  "
              f"{'yes' if r['sustained_stall_ms'] <= r['copy_ms'] else 'no'}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"ranks": RANKS, "steps": STEPS, "rows": rows},
                                            indent=2) + "\n")


if __name__ == "__main__":
    main()
