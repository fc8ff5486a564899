"""Shared job builders for runtime tests (pipeweave.testing holds the equivalence helper)."""

from __future__ import annotations

from typing import Any

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan

GPT = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 16}


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
