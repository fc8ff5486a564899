"""PipeDream-2BW: PipeDream's 1F1B without flush, an update every M backwards, two weight versions.

wpipe.txt §2–3 (Figure 2d): gradients of a batch of ``M`` micro-batches are accumulated and
applied once (update period ``M``), and every micro-batch of batch ``b`` runs forward and
backward at version ``max(0, b - 1)``, the weights produced after batch ``b - 2``. The update
therefore reads ``W(t+1) = W(t) - lr * grad f(W(t-1))`` with one delay term on every stage,
and a stage holds at most two versions (the one batch ``b`` uses and the newest). It needs
``M >= P``, the condition the paper states (wpipe.txt §3.3 "M >= N" and Eq. 3 in §4.2,
"M >= d", the gradient-accumulation period at least the pipeline depth): the first forward of
batch ``b`` on stage 0 comes right after the backward of micro-batch ``b*M - P``, by which
point batch ``b - 2`` must be complete (``M >= P - 1`` would just suffice; we keep the paper's).
With replicated stages (1F1B-RR, an all-reduce before each update) the same argument per replica
gives ``M >= r_s * depth(s)`` on every stage (:func:`min_microbatches`).

P=2, M=2, K=3 (batch 0 and 1 at version 0, batch 2 at version 1)::

    rank0  F0@0 F1@0 B0@0 F2@0 B1@0 U@1 F3@0 B2@0 F4@1 B3@0 U@2 F5@1 B4@1 B5@1 U@3
    rank1       F0@0 B0@0 F1@0 B1@0 U@1 F2@0 B2@0 F3@0 B3@0 U@2 F4@1 B4@1 F5@1 B5@1 U@3
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Schedule
from .async_common import DRAIN, Counts, Tags, async_layout, build_async, warmup_depth
from .corrections import NESTEROV, WARMUP
from .registry import Shape, register

__all__ = ["two_bw", "min_microbatches"]


def min_microbatches(shape: Shape) -> int:
    """Smallest M: every replica's batch share ``M / r_s`` covers its warm-up depth.

    That is ``M >= r_s * depth(s)`` on every stage, the paper's ``M >= P`` for a straight
    pipeline (``depth(s) = P - s``) and its analogue per replica for 1F1B-RR.
    """
    if shape.chunks != 1 or shape.pipelines != 1:
        return shape.stages  # rejected by the generator with its own message
    layout = shape.layout()
    return max(layout.replicas(s) * warmup_depth(layout, s) for s in range(layout.num_stages))


@register("2bw",
          description="PipeDream-2BW: 1F1B without flush, update every M backwards, <= 2 weight versions",
          paper="D. Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training (PipeDream-2BW), ICML 2021", synchronous=False,
          min_microbatches=min_microbatches, options=(DRAIN, WARMUP, NESTEROV),
          width=True, replicas=True, checkpointable=True)
def two_bw(shape: Shape) -> Schedule:
    layout = async_layout("2bw", shape)
    m = shape.microbatches
    needed = min_microbatches(shape)
    if m < needed:
        raise ValueError(
            f"schedule '2bw' needs microbatches >= {needed} (M >= P, wpipe.txt §3.3 and Eq. 3; with "
            f"replicas M >= r_s * depth(s) on every stage) so that a batch starts only after the "
            f"batch two before it has been applied; got microbatches={m} for {shape.stages} "
            f"stages, use microbatches={needed}"
        )

    def double_buffered(stage: int, microbatch: int, counts: Mapping[tuple[int, int], Counts]) -> Tags:
        count = counts[(stage, microbatch)]
        version = max(count.drained, microbatch // m - 1)  # a drain: the first batch is fresh
        latest = count.forward
        # M >= r_s * depth(s) makes batch b - 2 complete before batch b's first forward here.
        assert version <= latest, (stage, microbatch, version, latest)
        return Tags(version, version)

    return build_async("2bw", shape, layout, period=lambda stage: m // layout.replicas(stage),
                       rule=double_buffered)
