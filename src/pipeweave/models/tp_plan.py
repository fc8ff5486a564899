"""Which linears of a block tensor parallelism splits, and how (Megatron's column/row layout).

One description, two readers: the runtime turns it into ``torch.distributed.tensor.parallel``
styles (:mod:`pipeweave.runtime.execution.tensor_parallel`), and the profiler reads from it
what a tensor-parallel process holds and which collectives it runs
(:mod:`pipeweave.profiler.tp_facts`), so the simulator and the memory model cost the plan the
runtime runs. Kinds:

* ``heads``: the GPT's fused ``qkv``, column-wise by heads (q, k and v each split);
* ``column``: column-wise (``ColwiseParallel``): weight and bias split by output features;
* ``row``: row-wise (``RowwiseParallel``): weight split by input features, bias whole.

The built-in GPT: attention ``qkv`` (heads) / ``proj`` (row), MLP ``fc`` (column) / ``proj``
(row). The Llama family (by the linears' names): ``q_proj``, ``k_proj``, ``v_proj`` column,
``o_proj`` row; ``gate_proj``, ``up_proj`` column, ``down_proj`` row.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .gpt import AttentionBlock, FFNBlock

__all__ = ["SPLIT_KINDS", "part_kinds", "split_linears"]

SPLIT_KINDS = ("heads", "column", "row")

_HF_ATTENTION = {"q_proj": "column", "k_proj": "column", "v_proj": "column", "o_proj": "row"}
_HF_MLP = {"gate_proj": "column", "up_proj": "column", "down_proj": "row"}


def _has(part: nn.Module, names: Sequence[str]) -> bool:
    return all(isinstance(getattr(part, n, None), nn.Linear) for n in names)


def part_kinds(part: nn.Module) -> dict[str, str]:
    """The split of one attention or MLP module: its linears' names to their kinds."""
    if isinstance(part, AttentionBlock):
        return {"qkv": "heads", "proj": "row"}
    if isinstance(part, FFNBlock):
        return {"fc": "column", "proj": "row"}
    if _has(part, tuple(_HF_ATTENTION)):  # the Llama family: q, k, v by (key-value) heads
        return dict(_HF_ATTENTION)
    if _has(part, tuple(_HF_MLP)):  # SwiGLU: gate and up by hidden units, down row-wise
        return dict(_HF_MLP)
    return {}


def split_linears(block: nn.Module) -> dict[str, str]:
    """Every split linear of ``block``, by its dotted path in the block, to its kind."""
    plan: dict[str, str] = {}
    for name, part in block.named_modules():
        plan.update({f"{name}.{key}" if name else key: kind
                     for key, kind in part_kinds(part).items()})
    return plan
