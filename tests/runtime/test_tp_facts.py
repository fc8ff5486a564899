"""The profile's tensor-parallel facts (``profiler/tp_facts.py``) are what the runtime's plan
does: per block, the all-reduces ``parallelize_stage`` issues in a forward and in a backward
(counted by torch's ``CommDebugMode``), and the bytes of the parameters it splits (the local
shards' bytes times ``tp``, plus what stays whole, is the block's). One process, a fake
process group of two (collectives do nothing, shapes are real)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from pipeweave.models import build_model
from pipeweave.models.tp_plan import split_linears
from pipeweave.profiler.tp_facts import tp_facts
from pipeweave.runtime.execution.tensor_parallel import make_rank_mesh, parallelize_stage

TP = 2


@pytest.fixture
def fake_group() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _all_reduces(mode: CommDebugMode) -> int:
    counts = mode.get_comm_counts()
    assert set(str(op) for op in counts) <= {"c10d_functional.all_reduce"}, counts
    return sum(counts.values())


MODELS = [("gpt-tiny", {}), ("gpt-tiny", {"sublayer": False})]
if importlib.util.find_spec("transformers") is not None:
    MODELS += [("hf-llama", {"sublayer": True})]


@pytest.mark.parametrize(("name", "overrides"), MODELS,
                         ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in MODELS])
def test_facts_match_the_runtime_plan(fake_group: None, name: str,
                                      overrides: dict[str, bool]) -> None:
    mesh = make_rank_mesh(depth=1, width=1, tp=TP, process=0, device_type="cpu").tp_mesh
    spec = build_model(name, **overrides)
    x: torch.Tensor = torch.randint(0, 64, (2, 16))
    split_blocks = 0
    for block in spec.blocks:
        with torch.no_grad():
            y = block(x)
        facts = tp_facts(block, x)
        whole = sum(p.numel() * p.element_size() for p in block.parameters())
        stage = torch.nn.Sequential(block)
        parallelize_stage(stage, mesh)
        local = [(p.to_local(), p.placements) for p in stage.parameters()
                 if isinstance(p, DTensor)]
        kept = sum(t.numel() * t.element_size() for t, placements in local
                   if placements != (Replicate(),))
        assert TP * kept == facts.split_parameter_bytes
        assert whole - facts.split_parameter_bytes == sum(
            t.numel() * t.element_size() for t, placements in local
            if placements == (Replicate(),))
        inputs = x.detach().requires_grad_(x.is_floating_point())
        outputs: list[int] = []
        columns = [stage[0].get_submodule(name) for name, kind in split_linears(block).items()
                   if kind != "row"]
        hooks = [m.register_forward_hook(lambda _m, _a, out: outputs.append(
            out.numel() * out.element_size())) for m in columns]
        with CommDebugMode() as forward:
            out = stage(inputs)
        for hook in hooks:
            hook.remove()
        assert TP * sum(outputs) == facts.split_output_bytes
        with CommDebugMode() as backward:
            out.float().sum().backward()
        assert _all_reduces(forward) == facts.forward_reduces, type(block).__name__
        assert _all_reduces(backward) == facts.backward_reduces, type(block).__name__
        split_blocks += facts.split_parameter_bytes > 0
        x = y
    assert split_blocks > 0
