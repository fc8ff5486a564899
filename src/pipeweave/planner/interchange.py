"""A plan in the words of two other systems: Megatron-Core's layout string and torchtitan's
``[parallelism]`` config (issue 29, item 4), so that a plan ``auto`` chose can be run or
compared there.

* **Megatron-Core** ``--pipeline-model-parallel-layout``: one ``|``-separated entry per
  (virtual) stage in pipeline order, each a run of ``E`` (embedding), ``t`` (one transformer
  layer) and ``L`` (final norm, output layer and loss); ``t*3`` repeats. Megatron places whole
  layers, so a plan that cuts between a layer's attention and MLP halves (AutoPipe's
  sub-layer partition) has no layout: :class:`NotExpressible` says which boundary.
* **torchtitan** ``[parallelism]``: ``pipeline_parallel_degree``, ``pipeline_parallel_schedule``
  (torch's schedule class name), ``pipeline_parallel_microbatch_size``,
  ``pipeline_parallel_split_points`` (the FQNs ``layers.N`` that start each stage after the
  first), ``data_parallel_replicate_degree``, and ``[activation_checkpoint] mode``. Only the
  schedules torch's ``torch.distributed.pipelining`` implements have one.

Block names follow pipeweave's models: ``embed``, ``layer<N>`` or ``layer<N>.attn`` /
``layer<N>.ffn``, ``head`` (built-in GPTs and :mod:`pipeweave.hf`), as in a profile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..schedules import available_schedules, get_info
from .plan import Plan

__all__ = ["NotExpressible", "megatron_layout", "torchtitan_config"]


_LAYER = re.compile(r"^layer(\d+)(?:\.(attn|ffn))?$")


class NotExpressible(ValueError):
    """The plan has no equivalent in the other system; the message says why."""


def _symbol(name: str) -> tuple[str, int | None, str | None]:
    """``(symbol, layer index, half)`` of a block name."""
    if name == "embed":
        return "E", None, None
    if name == "head":
        return "L", None, None
    found = _LAYER.match(name)
    if found is None:
        raise NotExpressible(f"block {name!r} is not an embedding, transformer layer or head; "
                             f"these layouts describe transformer language models")
    return "t", int(found.group(1)), found.group(2)


def _check_whole_layers(plan: Plan, names: Sequence[str]) -> None:
    if len(names) != plan.num_blocks:
        raise ValueError(f"{len(names)} block names for a plan of {plan.num_blocks} blocks; give "
                         f"the model's (or the profile's) block names")
    for start, _ in plan.stages[1:]:
        _, layer, half = _symbol(names[start])
        if half == "ffn":
            raise NotExpressible(f"the stage starting at block {start} ({names[start]}) cuts "
                                 f"layer {layer} between its attention and MLP halves; Megatron "
                                 f"and torchtitan place whole layers (plan with --method on "
                                 f"whole layers, or a model without sub-layer blocks)")


def megatron_layout(plan: Plan, names: Sequence[str]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for ``plan``, e.g. ``"Et*2|t*2L"``."""
    _check_whole_layers(plan, names)
    entries = []
    for start, end in plan.stages:
        symbols = []
        for index in range(start, end):
            symbol, _, half = _symbol(names[index])
            if half != "ffn":  # a layer counts once, at its attention half
                symbols.append(symbol)
        entries.append(_compress("".join(symbols)))
    return "|".join(entries)


def _compress(run: str) -> str:
    """``"Etttt"`` -> ``"Et*4"``: repeated layers as ``t*n``."""
    return re.sub(r"t{2,}", lambda m: f"t*{len(m.group(0))}", run)


def torchtitan_config(plan: Plan, names: Sequence[str], *, batch_size: int) -> str:
    """torchtitan's ``[parallelism]`` and ``[activation_checkpoint]`` TOML for ``plan`` with
    ``batch_size`` samples per iteration and pipeline copy."""
    torch_schedule = get_info(plan.schedule).torch_schedule
    if torch_schedule is None:
        runs = sorted(i.name for i in available_schedules() if i.torch_schedule is not None)
        raise NotExpressible(f"schedule {plan.schedule!r} has no torch.distributed.pipelining "
                             f"equivalent (torch runs {', '.join(runs)})")
    if plan.replicas is not None or plan.pipelines != 1:
        raise NotExpressible("replicated stages and AvgPipe's parallel pipelines have no "
                             "torchtitan equivalent")
    _check_whole_layers(plan, names)
    if batch_size % plan.microbatches:
        raise ValueError(f"batch size {batch_size} does not split into {plan.microbatches} "
                         f"micro-batches")
    splits = []
    for start, _ in plan.stages[1:]:
        _, layer, _ = _symbol(names[start])
        if layer is None:  # a stage that starts at the head: split before the output layer
            raise NotExpressible(f"the stage starting at block {start} ({names[start]}) holds "
                                 f"no transformer layer; torchtitan splits at layers.N")
        splits.append(f'"layers.{layer}"')
    if any(plan.recompute) and not all(plan.recompute):
        raise NotExpressible("recomputation on some stages only; torchtitan's activation "
                             "checkpointing applies to every stage (mode full or none)")
    recompute = "full" if any(plan.recompute) else "none"
    depth = len(plan.stages) // plan.chunks
    sharded = plan.shard != "none"  # FSDP2 over the width; grad-op keeps gathered parameters
    return "\n".join([
        "[parallelism]",
        f"pipeline_parallel_degree = {depth}",
        f'pipeline_parallel_schedule = "{torch_schedule}"',
        f"pipeline_parallel_microbatch_size = {batch_size // plan.microbatches}",
        f"pipeline_parallel_split_points = [{', '.join(splits)}]",
        f"data_parallel_replicate_degree = {1 if sharded else plan.width}",
        f"data_parallel_shard_degree = {plan.width if sharded else 1}",
        *(['fsdp_reshard_after_forward = "never"'] if plan.shard == "grad-op" else []),
        *([f"tensor_parallel_degree = {plan.tp}"] if plan.tp > 1 else []),
        "",
        "[activation_checkpoint]",
        f'mode = "{recompute}"',
        "",
    ])
