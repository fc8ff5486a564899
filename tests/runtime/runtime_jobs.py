"""Shared job builders for runtime tests (pipeweave.testing holds the equivalence helper)."""

from __future__ import annotations

from typing import Any

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan

GPT = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 16}


MESH_JOB_REFUSALS = [
    ({"clip_grad_norm": 1.0}, "--clip-grad-norm"),
    ({"apc": True}, "--apc"),
    ({"eval_every": 1}, "--eval-every"),
]
"""Job options that a sharded (``--shard``) or tensor-parallel (``tp``) run refuses before any
rank starts, and the flag each refusal names (test_sharding.py and test_tensor_parallel.py)."""


def gpt_job(*, depth: int, schedule: str = "1f1b", microbatches: int = 4, steps: int = 3,
            dtype: str = "float64", optimizer: str = "sgd", chunks: int = 1,
            plan_fields: dict[str, Any] | None = None, **job_fields: Any) -> Job:
    model = BuiltinModel("gpt-tiny", dtype=dtype, overrides=GPT)
    plan = Plan.uniform(6, depth, chunks=chunks, schedule=schedule, microbatches=microbatches,
                        **(plan_fields or {}))
    kwargs = {"lr": 0.05, "momentum": 0.9} if optimizer == "sgd" else {"lr": 1e-3}
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2 * microbatches, seq_len=16, dtype=dtype),
               optimizer=OptimizerFactory(optimizer, kwargs), return_parameters=True, **job_fields)


def mlp_job(*, depth: int, schedule: str = "1f1b", microbatches: int = 4, steps: int = 3,
            dtype: str = "float64", plan_fields: dict[str, Any] | None = None,
            **job_fields: Any) -> Job:
    plan = Plan.uniform(4, depth, schedule=schedule, microbatches=microbatches,
                        **(plan_fields or {}))
    return Job(plan=plan, steps=steps, model=BuiltinModel("mlp", dtype=dtype),
               data=BuiltinData("digits", batch_size=4 * microbatches, dtype=dtype),
               optimizer=OptimizerFactory("adam", {"lr": 1e-2}), return_parameters=True,
               **job_fields)


class RankFaultData:
    """Digits batches; on ``rank`` the ``at``-th batch raises (mode "raise") or hangs ("hang")."""

    def __init__(self, *, rank: int, at: int, mode: str, batch_size: int = 16) -> None:
        self.rank, self.at, self.mode, self.batch_size = rank, at, mode, batch_size

    def __call__(self):  # type: ignore[no-untyped-def]
        import time

        import torch
        import torch.distributed as dist

        from pipeweave.data import build_dataset

        stream = build_dataset("digits", batch_size=self.batch_size, dtype=torch.float64)
        me = dist.get_rank() if dist.is_initialized() else -1
        for index, batch in enumerate(stream):
            if me == self.rank and index == self.at:
                if self.mode == "raise":
                    raise RuntimeError(f"injected failure on rank {me}")
                time.sleep(3600)
            yield batch


def mismatched_model():  # type: ignore[no-untyped-def]
    """Two blocks whose shapes don't agree: 64 -> 32, then a layer expecting 16 inputs."""
    import torch
    from torch import nn

    from pipeweave.models import ModelSpec

    torch.manual_seed(0)
    return ModelSpec.from_blocks([nn.Linear(64, 32).double(), nn.Linear(16, 10).double()],
                                 torch.nn.functional.cross_entropy)


def allocator_peaks(plan: Plan, model: str = "gpt-small", batch: int = 4, *,
                    runs: int = 1) -> list[int | None]:
    """Each rank's peak of live tensor bytes at torch's allocator over two Adam steps of
    ``plan`` on real processes (stdlib bytes): what the memory model's tests compare with.

    ``runs > 1``: the least of each rank's peaks over that many runs, for measurements that
    still move between runs (tensor-parallel stages' collectives, test_tp_memory.py). A
    buffer that gloo's worker thread freed was never seen freed (its frees are not profiled):
    the pipeline's all-reduce and FSDP2's collectives now let go on the rank's thread
    (``communication/let_go.py``), and sharded and data-parallel runs measure the same peak
    every time."""
    if runs > 1:
        peaks = [allocator_peaks(plan, model, batch) for _ in range(runs)]
        return [None if None in rank else min(p for p in rank if p is not None)
                for rank in zip(*peaks)]
    from pipeweave.models import default_seq_len
    from pipeweave.runtime import launch_local

    job = Job(plan=plan, steps=2, model=BuiltinModel(model),
              data=BuiltinData("stdlib-bytes", batch_size=batch, seq_len=default_seq_len(model),
                               seed=0),
              optimizer=OptimizerFactory("adam"), track_allocations=True,
              record_timeline=False, timeout_s=300.0)
    return [r.peak_allocated_bytes for r in sorted(launch_local(job, deadline_s=500),
                                                   key=lambda r: r.rank)]
