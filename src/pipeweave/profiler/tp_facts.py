"""What tensor parallelism would split of a block, read off the runtime's own plan.

The plan is :func:`pipeweave.models.tp_plan.split_linears` (what the runtime's
``parallelize_stage`` applies). From it, per block:

* ``split_parameter_bytes``: the split linears' weights, and the biases of the column-wise
  ones (a row-wise linear's bias stays whole); everything else (embeddings, norms, the head,
  row-wise biases) is replicated;
* ``forward_reduces``: one all-reduce of the block's activation per row-wise linear (its
  partial sums, ``RowwiseParallel``'s output ``Partial -> Replicate``);
* ``backward_reduces``: one per column-wise (or by-heads) linear: its input is a replicated
  tensor made a DTensor on entry (``DTensor.from_local``), so its gradient, a partial sum
  over the processes' columns, is all-reduced in the backward (Megatron's ``f``). Three for
  the Llama attention's ``q_proj``, ``k_proj``, ``v_proj`` (each its own), one for the GPT's
  fused ``qkv``;
* ``split_saved_bytes``: of the bytes autograd saves in a forward, those saved between a
  column-wise linear's output and the next row-wise linear's output (the heads' q, k, v and
  attention, the MLP's hidden units, the row-wise linear's input): a process holds ``1/T``
  of them. What a column-wise linear saves (its input) and what the norms save is whole;
* ``split_output_bytes``: the column-wise linears' outputs, split over the processes: of a
  split backward's ``pending_bytes`` (the gradients of the parameter holders' outputs) the
  gradients of these are split too.

``tests/runtime/test_tp_facts.py`` counts the collectives the runtime actually issues
(torch's ``CommDebugMode``) and compares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..models.tp_plan import split_linears
from ..saved_tensors import observing_saved

__all__ = ["TpFacts", "tp_facts"]


@dataclass(frozen=True)
class TpFacts:
    """One block under the tensor-parallel plan (module docstring)."""

    split_parameter_bytes: int
    forward_reduces: int
    backward_reduces: int
    split_saved_bytes: int
    split_output_bytes: int = 0


def tp_facts(block: nn.Module, inputs: Tensor) -> TpFacts:
    """:class:`TpFacts` of ``block`` run on ``inputs`` (one forward, no backward)."""
    plan = split_linears(block)
    modules = dict(block.named_modules())
    split = 0
    for name, kind in plan.items():
        linear = modules[name]
        split += sum(p.numel() * p.element_size() for key, p in linear.named_parameters()
                     if kind != "row" or key == "weight")
    kinds = list(plan.values())
    outputs: list[int] = []
    saved = _split_saved(block, inputs, plan, modules, outputs)
    return TpFacts(split_parameter_bytes=split, forward_reduces=kinds.count("row"),
                   backward_reduces=len(kinds) - kinds.count("row"),
                   split_saved_bytes=saved, split_output_bytes=sum(outputs))


def _split_saved(block: nn.Module, inputs: Tensor, plan: dict[str, str],
                 modules: dict[str, nn.Module], outputs: list[int]) -> int:
    """Bytes saved inside the split region (module docstring), each storage once, the
    block's own parameters left out; the column-wise linears' output bytes appended to
    ``outputs``."""
    if not plan:
        return 0
    own = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: set[int] = set()
    total = 0
    inside = [False]

    def count(tensor: Tensor) -> None:
        nonlocal total
        pointer = tensor.untyped_storage().data_ptr()
        if inside[0] and pointer not in own and pointer not in seen:
            seen.add(pointer)
            total += tensor.untyped_storage().nbytes()

    x = inputs.detach().requires_grad_(inputs.is_floating_point())
    with _region(plan, modules, inside, outputs), observing_saved(count):
        block(x)
    return total


@contextmanager
def _region(plan: dict[str, str], modules: dict[str, nn.Module], inside: list[bool],
            outputs: list[int]) -> Iterator[None]:
    """Keeps ``inside[0]``: True from a column-wise linear's output to a row-wise one's;
    appends each column-wise output's bytes to ``outputs``."""
    def setter(value: bool) -> Any:
        def hook(_module: nn.Module, _args: Any, *output: Any) -> None:
            inside[0] = value
            if value and output and isinstance(output[0], Tensor):
                outputs.append(output[0].numel() * output[0].element_size())
        return hook

    with ExitStack() as stack:
        for name, kind in plan.items():
            module = modules[name]
            column = kind != "row"
            if column:  # its input (saved by it) is whole
                stack.callback(module.register_forward_pre_hook(setter(False)).remove)
            stack.callback(module.register_forward_hook(setter(column)).remove)
        yield

