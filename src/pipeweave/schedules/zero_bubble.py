"""Zero-bubble schedules ZB-H1 and ZB-H2 (P. Qi et al., Zero Bubble Pipeline Parallelism, ICLR
2024, §2): 1F1B with every backward split into its input gradient ``I`` (what the previous
stage waits for) and its weight gradient ``W`` (which nothing downstream waits for, so it can
move later and fill the bubbles).

Both are one rule with two settings. Stage ``i`` of ``P`` runs ``warmup`` forwards, then for
every micro-batch ``k`` in order: the next forward (while one is left), ``I_k`` and
``W_{k-defer}``; the ``defer`` weight gradients still owed close the iteration. An activation
is held from its ``F`` until its ``W``, so stage ``i`` holds at most
``min(warmup + 1 + defer, M)`` micro-batches.

**ZB-H1** (``warmup = P-1-i``, ``defer = i``): 1F1B's warm-up, and each stage defers as many
``W``'s as it is deep, so that every stage holds ``P`` activations — 1F1B's peak, which 1F1B
reaches on the first stage only. The ``I``'s travel back up without waiting for the ``W``'s, and
the deferred ``W``'s fill the cool-down. P=4, M=8, F = I = W = 1 (iteration 27; 1F1B's,
with B = I + W, is 33)::

    rank0  F0 F1 F2 F3 .  .  .  I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7
    rank1  .  F0 F1 F2 .  .  I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7
    rank2  .  .  F0 F1 .  I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7
    rank3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7

For ``M >= P`` each stage idles ``(P-1)(F+I-W)`` (the paper's ``(p-1)(T_F+T_B-T_W)``, its
``B`` being our ``I``) when ``W <= min(F, I)``, against 1F1B's ``(P-1)(F+I+W)``: a third of it
at equal costs. (Otherwise the simulator finds ``(P-1) max(F, I, F+I-W)``.)

**ZB-H2** (``warmup = 2(P-1-i)``, ``defer = 2i``): the first stage runs ``2P-1`` forwards
before its first ``I`` — exactly enough to cover the round trip of micro-batch 0 — and stage
``i`` defers ``2i`` weight gradients, so the tail is a parallelogram instead of 1F1B's
trapezoid; every stage holds up to ``2P-1`` activations. P=4, M=8, unit costs::

    rank0  F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7
    rank1  .  F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7
    rank2  .  .  F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7
    rank3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7

For ``M >= 2P-1`` and ``I <= F`` the last stage never waits after its first forward, so
one iteration takes ``M(F+I+W) + (P-1)F``: at equal costs the same 27 as ZB-H1, less when
``W < I``. What the parallelogram buys shows over several iterations: at equal costs stage
``i`` is busy without a gap from ``i`` to ``i + 3M``, the first stage finishes first, and its
update needs only its own ``W``'s, so iteration ``k+1`` starts on stage ``i`` as soon as stage
``i`` has stepped; the parallelograms tile, and ``K`` iterations take ``3KM + P-1`` — no
bubble in the steady state (75 for K=3 above, against ZB-H1's 81).

What this is and is not: each iteration is the paper's ZB-H2 layout followed, on every
stage, by that stage's update once its last ``W`` has run (:func:`.common.flush_schedule`);
the semantics stay synchronous (every ``W`` of iteration ``k`` runs before update ``k+1`` of
its stage, and iteration ``k+1`` uses the updated weights). Real training checks every
stage's gradients together before a step (global gradient-norm clipping, ``--clip-grad-norm``;
the NaN/Inf check of mixed precision): an all-stage synchronisation that puts the flush back
(the parallelogram's two triangles). The option ``post_validation`` writes that check into
the schedule (:mod:`.global_check`): ``post_validation=false`` checks before every update
(the flush, as the runtime's all-stage clipping without the option does it, now visible to
the simulator), ``post_validation=true`` is the paper's optimizer post-validation (§4): each
stage steps optimistically on the partially reduced state, runs its next warm-up forwards,
and validates when the complete state comes back up the pipeline, undoing and redoing the
step (and the forwards that ran on it) only when the check clips or finds a NaN. At equal
costs, P=4, M=8, K=3: 75 with post-validation (the tiling above), 81 with the check before
the update.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Op, Schedule
from .async_common import DRAIN, drain_every
from .common import flush_schedule
from .global_check import with_global_check
from .registry import Shape, register

__all__ = ["zb_h1", "zb_h2", "split_order", "zb_h1_order", "zb_h2_order"]

_PAPER = "P. Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024"


def split_order(microbatches: Sequence[int], *, warmup: int, defer: int) -> list[tuple[Op, int]]:
    """``warmup`` forwards; per micro-batch ``k``: the next forward, ``I_k``, ``W_{k-defer}``;
    then the deferred ``W``'s (module docstring)."""
    n = len(microbatches)
    warmup = min(warmup, n)
    order = [(Op.FORWARD, microbatches[k]) for k in range(warmup)]
    weights = 0
    for k in range(n):
        if warmup + k < n:
            order.append((Op.FORWARD, microbatches[warmup + k]))
        order.append((Op.BACKWARD_INPUT, microbatches[k]))
        if k >= defer:
            order.append((Op.BACKWARD_WEIGHT, microbatches[weights]))
            weights += 1
    order.extend((Op.BACKWARD_WEIGHT, microbatches[k]) for k in range(weights, n))
    return order


def zb_h1_order(position: int, depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
    """ZB-H1 on stage ``position`` of ``depth``: 1F1B's warm-up, ``position`` W's deferred."""
    return split_order(microbatches, warmup=depth - position - 1, defer=position)


def zb_h2_order(position: int, depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
    """ZB-H2 on stage ``position`` of ``depth``: twice 1F1B's warm-up, ``2 position`` W's
    deferred."""
    return split_order(microbatches, warmup=2 * (depth - position - 1), defer=2 * position)


def _one_chunk(name: str, shape: Shape) -> None:
    if shape.chunks != 1:
        raise ValueError(
            f"schedule {name!r} runs one stage per rank, got chunks={shape.chunks}; use chunks=1"
        )


@register("zb-h1",
          description="zero bubble H1: 1F1B with the backward split into I and W, W's deferred "
                      "into the cool-down; 1F1B's peak activations (P), a third of its bubble",
          paper=f"{_PAPER}, §2.1 (ZB-H1)", synchronous=True,
          width=True, replicas=True, split_backward=True)
def zb_h1(shape: Shape) -> Schedule:
    _one_chunk("zb-h1", shape)
    return flush_schedule("zb-h1", shape, zb_h1_order)


@register("zb-h2",
          description="zero bubble H2: 2P-1 warm-up forwards, W's deferred into a parallelogram "
                      "that tiles across iterations (no steady-state bubble); up to 2P-1 "
                      "activations; post_validation=true: the global gradient check after the "
                      "step (the paper's optimizer post-validation), false: before it (a flush)",
          paper=f"{_PAPER}, §2.2 (ZB-H2), §4 (optimizer post-validation)", synchronous=True,
          options=("post_validation", DRAIN),
          width=True, replicas=True, split_backward=True)
def zb_h2(shape: Shape) -> Schedule:
    _one_chunk("zb-h2", shape)
    schedule = flush_schedule("zb-h2", shape, zb_h2_order)
    post = shape.options.get("post_validation")
    if post is None:
        return schedule
    if not isinstance(post, bool):
        raise ValueError(f"zb-h2 option post_validation={post!r} must be true (check the "
                         f"gradients after the step, the paper's post-validation) or false "
                         f"(before it); e.g. --option post_validation=true")
    return with_global_check(schedule, post=post, drain=drain_every("zb-h2", shape))
