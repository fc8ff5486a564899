"""What one tensor-parallel process of a stage costs: a profile as that process sees it.

With ``tp = T`` each pipeline rank runs as ``T`` processes that split the stage's attention
and MLP linears (Megatron's column/row layout, docs/sharding.md). The profile records, per
block, what the runtime's plan splits and which collectives it runs
(:mod:`pipeweave.profiler.tp_facts`); :func:`tp_profile` turns a profile into the profile
of one process, so that the memory model, the simulator's costs and ``auto`` read a
tensor-parallel plan exactly as they read any other, with no second formula::

    parameter_bytes    replicated + split / T        (optimizer state and the optimizer
                                                      step in the same proportion)
    activation_bytes   replicated + split / T        (no sequence parallelism: the norms'
                                                      inputs and outputs stay whole)
    pending_bytes      less (1 - 1/T) of the column-wise linears' outputs (their
                       gradients, kept from a split backward's I to its W, are split);
                       recorded_bytes stay whole
    forward            forward / T  + n_f * allreduce(output_bytes, T)
    backward           backward / T + n_b * allreduce(output_bytes, T)
    input_grad (I)     input_grad / T + n_b * allreduce(output_bytes, T)
    weight_grad (W)    weight_grad / T                (the weights' gradients are local)

for a block the plan splits (``tp_split_parameter_bytes > 0``); a replicated block
(embeddings, the head) keeps its times and bytes: every process computes it whole.
**Assumption**: a split block's compute divides by ``T`` (its matrix products do; its norms
and residual adds, run whole on every process, are a few per cent of it). ``n_f`` and ``n_b``
are the plan's all-reduces per forward and backward (GPT: one each per attention or MLP
block, two each per whole layer; Llama: 1 and 3 per attention half, 1 and 2 per MLP half),
each of the block's output, ``batch x seq x d_model`` elements; a ring all-reduce over ``T``
processes joined at bandwidth ``B`` is two ring phases (:func:`.sharded_costs.ring_phase_time`,
pipedream.txt §3.1's ``4 (T-1) |a| / (T B)``) plus ``2 (T-1)`` message latencies. Stage
boundaries are whole (each of the ``T`` lanes carries its own copy), so ``output_bytes`` and
the messages between stages do not change. No torch.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..profiler import BlockProfile, Profile
from .sharded_costs import ring_phase_time

__all__ = ["ring_allreduce_time", "tp_profile", "tp_ready"]


def ring_allreduce_time(nbytes: float, ways: int, bandwidth: float,
                        latency: float = 0.0) -> float:
    """A ring all-reduce of ``nbytes`` over ``ways`` processes: two ring phases
    (reduce-scatter, all-gather), ``4 (T-1) |a| / (T B) + 2 (T-1) latency``."""
    return 2.0 * ring_phase_time(nbytes, ways, bandwidth, latency)


def tp_ready(profile: Profile) -> bool:
    """Whether ``profile`` records what tensor parallelism splits (some block has split
    parameters): profiles measured before it was recorded, or of models without a plan,
    have none."""
    return any(b.tp_split_parameter_bytes > 0 for b in profile.blocks)


def tp_profile(profile: Profile, tp: int, *, bandwidth: float = math.inf,
               latency: float = 0.0) -> Profile:
    """``profile`` as one of ``tp`` tensor-parallel processes sees it (module docstring);
    ``bandwidth``, ``latency``: the link among the ``tp`` processes. A profile that already
    is that view (``metadata["tp"] == tp``) is returned as it is."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r}: give the tensor-parallel size as an int >= 1")
    seen = profile.metadata.get("tp", 1)
    if tp == seen:  # whole (tp 1), or already this view (auto views once per tp)
        return profile
    if seen != 1:
        raise ValueError(f"profile of {profile.model!r} is already one of {seen} "
                         f"tensor-parallel processes' view, not of {tp}; give the whole "
                         f"model's profile")
    if not tp_ready(profile):
        raise ValueError(f"tp={tp}: the profile of {profile.model!r} records no tensor-parallel "
                         f"split (a model without a split plan, or a profile written before "
                         f"it was recorded); profile it again with `pipeweave profile`, or tp=1")
    blocks = tuple(_block(b, tp, bandwidth, latency) for b in profile.blocks)
    return replace(profile, blocks=blocks, metadata={**profile.metadata, "tp": tp})


def _block(block: BlockProfile, tp: int, bandwidth: float, latency: float) -> BlockProfile:
    split = block.tp_split_parameter_bytes
    if split <= 0:
        return block
    params = block.parameter_bytes - split + split / tp
    share = params / block.parameter_bytes
    saved = block.tp_split_activation_bytes
    activations = block.activation_bytes - saved + saved / tp
    reduce = ring_allreduce_time(block.output_bytes, tp, bandwidth, latency)
    backward_reduces = block.tp_backward_reduces * reduce
    pending = max(0.0, block.pending_bytes - block.tp_split_output_bytes * (1 - 1 / tp))
    shrunk = (block.parameter_bytes - params) + (block.activation_bytes - activations)
    return replace(
        block,
        forward=block.forward / tp + block.tp_forward_reduces * reduce,
        backward=block.backward / tp + backward_reduces,
        input_grad=block.input_grad / tp + backward_reduces if block.input_grad > 0 else 0.0,
        weight_grad=block.weight_grad / tp,
        update=block.update * share,
        parameter_bytes=params, optimizer_bytes=block.optimizer_bytes * share,
        activation_bytes=activations, pending_bytes=pending,
        tp_split_output_bytes=block.tp_split_output_bytes / tp,
        peak_memory_bytes=max(0.0, block.peak_memory_bytes - shrunk),
        tp_split_parameter_bytes=split / tp, tp_split_activation_bytes=saved / tp)
