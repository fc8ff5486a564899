"""V-Min and V-Half: V-shape building blocks with controllable memory.

Qi et al. (Pipeline Parallelism with Controllable Memory, NeurIPS 2024) build a schedule by
repeating one *building block*, the passes of one micro-batch, every ``T`` time units; the
block's lifespan on a rank (its first forward to its last weight gradient there) fixes the
rank's peak activation memory. On the V placement (:mod:`.v_shape`) they give blocks holding
about 1/3 (V-Min) and 1/2 (V-Half) of 1F1B's activations: ``floor((P+4)/3)`` and
``floor((P+2)/2)`` stage units (micro-batches' worth on a full stage; 1F1B holds ``P``).

The block implemented here, at unit cost (``F = I = W = 1`` per chunk) with period ``T = 6``
(the six passes a rank does per micro-batch): micro-batch 0's passes are placed one after the
other in the order ``F`` of stages ``0 .. 2P-1``, ``I`` of stages ``2P-1 .. 0``, then ``W`` of
stages ``2P-1 .. 0``, each at the earliest unit step that

* comes after the pass it depends on has finished (``F(s-1)``; ``F(2P-1)`` or ``I(s+1)``;
  its own ``I``), plus ``gap`` idle steps before every forward of chunk 1 (stages ``P ..
  2P-1``, the V's way back up), and
* is free on its rank modulo ``T``: no two of a rank's six passes share a residue, so the
  copies of the block for micro-batch ``i`` (everything shifted by ``6i``) never collide and the
  steady state has no bubble.

V-Min is ``gap = 0`` (the tightest V), V-Half ``gap = 1``. A rank runs its passes in the order
of their block times; the walk of the schedule then starts each as early as its inputs allow,
which squeezes the warm-up (the paper's "squeeze"; it also reorders, this does not).

Memory rule, counted from the schedules by the tests (a chunk activation is held from its
``F`` to its ``W``; two of them are one stage unit, :mod:`.v_shape`): on every rank at most
``2 * floor((P+4)/3)`` chunk activations for V-Min and ``2 * floor((P+2)/2)`` for V-Half —
the paper's counts — and exactly that on the fullest rank once ``M`` is large enough (checked
for ``P <= 16``). The price at unit cost is a longer fill than ZB-V's, shorter than 1F1B's.

P=2, M=4, unit-cost timelines (rank 0 holds stages 0 and 3). V-Min: iteration time 27 =
6M + P - 1 + 2; rank 0 never holds more than stage 0's and stage 3's activation of one
micro-batch each (two chunk activations), rank 1 at most four::

    rank0  0F0 .   .   3F0 3I0 3W0 0F1 0I0 0W0 3F1 3I1 3W1 0F2 0I1 0W1 3F2 3I2 3W2 0F3 0I2 0W2 3F3 3I3 3W3 .   0I3 0W3
    rank1  .   1F0 2F0 .   .   2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 1F2 2F2 2W1 1W1 2I2 1I2 1F3 2F3 2W2 1W2 2I3 1I3 2W3 1W3

V-Half (one idle step before each chunk-1 forward in the block: 0F1 moves up beside 3F0)::

    rank0  0F0 .   .   3F0 0F1 3I0 3W0 .   3F1 0F2 3I1 0I0 3W1 0W0 3F2 0F3 3I2 0I1 3W2 0W1 3F3 3I3 0I2 3W3 0W2 0I3 0W3
    rank1  .   1F0 2F0 .   .   1F1 2I0 2F1 1I0 2W0 1W0 1F2 2I1 2F2 1I1 2W1 1W1 1F3 2I2 2F3 1I2 2W2 1W2 2I3 1I3 2W3 1W3

With ``chunks=1`` the schedules are plain ``1f1b``.
"""

from __future__ import annotations

from functools import lru_cache

from ..ir import Op, Schedule
from .registry import Shape, register
from .v_shape import Pass, v_schedule

__all__ = ["v_min", "v_half", "building_block", "block_order"]

PERIOD = 6
"""Unit steps between the blocks of consecutive micro-batches: each rank's ``F``, ``I`` and
``W`` on its two chunks."""

Block = dict[tuple[Op, int], int]
"""Start step of each pass ``(op, stage)`` of micro-batch 0."""


@lru_cache(maxsize=64)
def building_block(P: int, gap: int) -> Block:
    """The block of micro-batch 0 (module docstring), ``gap`` idle steps before chunk-1 forwards."""
    last = 2 * P - 1
    taken: list[set[int]] = [set() for _ in range(P)]
    block: Block = {}

    def place(op: Op, stage: int, earliest: int) -> int:
        """Put the pass at the first step >= ``earliest`` free on its rank mod ``PERIOD``."""
        taken_here = taken[min(stage, last - stage)]
        step = earliest
        while step % PERIOD in taken_here:
            step += 1
        taken_here.add(step % PERIOD)
        block[(op, stage)] = step
        return step + 1

    ready = 0
    for stage in range(2 * P):
        ready = place(Op.FORWARD, stage, ready + (gap if stage >= P else 0))
    for stage in reversed(range(2 * P)):
        ready = place(Op.BACKWARD_INPUT, stage, ready)
    for stage in reversed(range(2 * P)):
        place(Op.BACKWARD_WEIGHT, stage, block[(Op.BACKWARD_INPUT, stage)] + 1)
    return block


def block_order(block: Block, P: int, M: int) -> list[list[Pass]]:
    """Every rank's passes of ``M`` micro-batches, in the order of their block times."""
    last = 2 * P - 1
    timed: list[list[tuple[int, Op, int, int]]] = [[] for _ in range(P)]
    for (op, stage), start in block.items():
        for i in range(M):
            timed[min(stage, last - stage)].append((start + PERIOD * i, op, stage, i))
    return [[(op, stage, i) for _, op, stage, i in sorted(row, key=lambda x: x[0])]
            for row in timed]


def _v_min_order(P: int, M: int) -> list[list[Pass]]:
    return block_order(building_block(P, 0), P, M)


def _v_half_order(P: int, M: int) -> list[list[Pass]]:
    return block_order(building_block(P, 1), P, M)


_PAPER = ("P. Qi, X. Wan, N. Amar, M. Lin, Pipeline Parallelism with Controllable Memory, "
          "NeurIPS 2024")


@register("v-min", description="V-Min: V-shape building block with the least memory, about 1/3 "
                               "of 1F1B's activations; backward split into I and W, flush per iteration",
          paper=f"{_PAPER} (V-Min)", synchronous=True, default_chunks=2, placement="v",
          width=True, replicas=True, chunks=(1, 2), split_backward=True)
def v_min(shape: Shape) -> Schedule:
    return v_schedule("v-min", shape, _v_min_order)


@register("v-half", description="V-Half: V-shape building block holding about 1/2 of 1F1B's "
                                "activations; backward split into I and W, flush per iteration",
          paper=f"{_PAPER} (V-Half)", synchronous=True, default_chunks=2, placement="v",
          width=True, replicas=True, chunks=(1, 2), split_backward=True)
def v_half(shape: Shape) -> Schedule:
    return v_schedule("v-half", shape, _v_half_order)
