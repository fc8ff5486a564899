"""``profile --precision``: the profiler measures what a bf16-mixed or bf16 run will hold."""

from __future__ import annotations

import pytest
import torch

from pipeweave.data import build_dataset
from pipeweave.models import build_model
from pipeweave.profiler.measure import profile_model

TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 16}


def profiled(precision: str):  # type: ignore[no-untyped-def]
    spec = build_model("gpt-tiny", **TINY)
    inputs, targets = next(iter(build_dataset("stdlib-bytes", batch_size=4, seq_len=16, seed=0)))
    return profile_model(spec, inputs, targets, warmup=0, repeats=1, precision=precision)


def test_bf16_mixed_and_bf16_profiles_hold_less() -> None:
    full, mixed, pure = profiled("full"), profiled("bf16-mixed"), profiled("bf16")
    assert [p.metadata["precision"] for p in (full, mixed, pure)] == ["full", "bf16-mixed", "bf16"]
    # autocast keeps float32 weights and optimizer state; bf16 halves them
    assert [b.parameter_bytes for b in mixed.blocks] == [b.parameter_bytes for b in full.blocks]
    assert [b.optimizer_bytes for b in mixed.blocks] == [b.optimizer_bytes for b in full.blocks]
    assert [2 * b.parameter_bytes for b in pure.blocks] == [b.parameter_bytes for b in full.blocks]
    # what the blocks save for their backward shrinks (bfloat16 matmul inputs)
    assert sum(b.activation_bytes for b in mixed.blocks) < sum(b.activation_bytes for b in full.blocks)
    assert sum(b.activation_bytes for b in pure.blocks) < sum(b.activation_bytes for b in mixed.blocks)
    # the head's logits come out of autocast's matmul in bfloat16: half the bytes
    assert mixed.blocks[-1].output_bytes * 2 == full.blocks[-1].output_bytes


def test_fp16_refused() -> None:
    with pytest.raises(ValueError, match="--precision fp16 is not supported"):
        profiled("fp16")


def test_colocated_steps_refused_beside_a_precision() -> None:
    from pipeweave.profiler.measure import profile_builtin

    with pytest.raises(ValueError, match="full precision only"):
        profile_builtin("gpt-tiny", colocated_ranks=2, precision="bf16-mixed", overrides=TINY)
    assert torch.get_default_dtype() == torch.float32
