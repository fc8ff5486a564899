"""Interleaved zero bubble: Megatron's interleaved order with the backward split, W's filling bubbles.

Qi et al. (Zero Bubble Pipeline Parallelism, ICLR 2024) split every backward into ``I``
(input gradient, what the previous stage waits for) and ``W`` (weight gradient, needed only by
the update) and move the ``W``'s into the bubbles; their ZB-H1 keeps 1F1B's memory. This is
that idea on Megatron's interleaved placement (stage ``s`` on rank ``s % P``, ``v`` chunks):

* every rank runs its forwards and input gradients in the order of ``interleaved-1f1b``
  (:func:`.interleaved.interleaved_order`, each ``B`` becoming its ``I``; with one chunk the
  ``1f1b`` order);
* its weight gradients wait in a queue and run, oldest first, at the unit steps where the next
  ``F``/``I`` cannot start yet because its input has not arrived (found by a unit-cost list
  schedule of all ranks at once, ``F = I = W = 1`` per chunk, messages free), and before a
  forward that would make the rank hold more chunk activations (each held from its ``F`` to
  its ``W``) than ``interleaved-1f1b`` holds on its fullest rank, rank 0 — ZB-H1's memory
  rule: the peak stays 1F1B's, the other ranks may use up to it; whatever is left runs before
  the update.

At unit cost an iteration then takes ``3Mv + P - 1`` steps: the fill is ``P - 1``, a third of
interleaved 1F1B's ``3(P - 1)`` (ZB-H1's ``(P-1)(F + I - W)`` against 1F1B's
``(P-1)(F + I + W)``). P=2, v=2, M=2 (stages 0,2 on rank 0 and 1,3 on rank 1), 13 steps::

    rank0  0F0 0F1 2F0 2F1 .   2I0 2W0 2I1 0I0 0I1 2W1 0W0 0W1
    rank1  .   1F0 1F1 3F0 3I0 3F1 3I1 1I0 1I1 3W0 3W1 1W0 1W1

With one chunk the registered schedule is plain ``1f1b``, as ``interleaved-1f1b`` is;
``interleaved_zb_order(P, M, 1)`` is ZB-H1's idea on the ``1f1b`` order (its test shows it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..ir import Op, Schedule
from .common import Pass, copies_schedule, flush_schedule, one_f_one_b_order
from .interleaved import check_interleaved_shape, interleaved_order
from .registry import Shape, register

__all__ = ["interleaved_zb", "interleaved_zb_order", "megatron_passes"]

_NEVER = float("inf")


def megatron_passes(rank: int, P: int, chunks: int, M: int) -> list[Pass]:
    """``interleaved-1f1b``'s order for one rank (``1f1b``'s with one chunk), ``B`` as ``I``."""
    if chunks == 1:
        order = [(op, rank, j) for op, j in one_f_one_b_order(rank, P, range(M))]
    else:
        order = interleaved_order(rank, P, chunks, range(M))
    return [(Op.BACKWARD_INPUT if op is Op.BACKWARD else op, stage, j) for op, stage, j in order]


def _held_peak(passes: Sequence[Pass]) -> int:
    """Chunk activations ``interleaved-1f1b`` holds at most: its ``B`` frees at once."""
    held = peak = 0
    for op, _, _ in passes:
        held += 1 if op is Op.FORWARD else -1
        peak = max(peak, held)
    return peak


def interleaved_zb_order(P: int, M: int, chunks: int) -> list[list[Pass]]:
    """Every rank's passes of one iteration (module docstring's rule)."""
    last = P * chunks - 1
    sequences = [megatron_passes(r, P, chunks, M) for r in range(P)]
    caps = [max(_held_peak(s) for s in sequences)] * P
    forward_done = [[_NEVER] * M for _ in range(last + 1)]
    input_done = [[_NEVER] * M for _ in range(last + 1)]
    position = [0] * P
    held = [0] * P
    waiting: list[deque[tuple[int, int]]] = [deque() for _ in range(P)]  # (stage, i) after I
    orders: list[list[Pass]] = [[] for _ in range(P)]
    remaining, t = 3 * M * chunks * P, 0
    while remaining:
        started = 0
        for r in range(P):
            choice: Pass | None = None
            if position[r] < len(sequences[r]):
                op, stage, i = sequences[r][position[r]]
                if op is Op.FORWARD and held[r] >= caps[r]:
                    assert waiting[r], (P, M, chunks, r)  # a deferred W holds the extra place
                elif op is Op.FORWARD:
                    if stage == 0 or forward_done[stage - 1][i] <= t:
                        choice = (op, stage, i)
                elif forward_done[stage][i] <= t and (stage == last or input_done[stage + 1][i] <= t):
                    choice = (op, stage, i)
            if choice is None and waiting[r]:
                stage, i = waiting[r].popleft()
                choice = (Op.BACKWARD_WEIGHT, stage, i)
                held[r] -= 1
            elif choice is not None:
                op, stage, i = choice
                position[r] += 1
                if op is Op.FORWARD:
                    forward_done[stage][i] = t + 1
                    held[r] += 1
                else:
                    input_done[stage][i] = t + 1
                    waiting[r].append((stage, i))
            if choice is not None:
                orders[r].append(choice)
                started += 1
        assert started, (P, M, chunks, t)  # interleaved 1F1B's order is deadlock-free
        remaining -= started
        t += 1
    return orders


@register("interleaved-zb",
          description="interleaved 1F1B with the backward split into I and W, W's filling "
                      "bubbles within interleaved 1F1B's memory; flush per iteration",
          paper="P. Qi, X. Wan, G. Huang, M. Lin, Zero Bubble Pipeline Parallelism, ICLR 2024 "
                "(ZB-H1's W scheduling) on D. Narayanan et al., Megatron-LM, SC 2021 (interleaved)",
          synchronous=True, min_microbatches=lambda shape: (
              shape.stages * shape.width if shape.chunks > 1 else 1), default_chunks=2,
          width=True, replicas=True, chunks=None, split_backward=True, torch_schedule="InterleavedZeroBubble")
def interleaved_zb(shape: Shape) -> Schedule:
    if shape.chunks == 1:
        # as interleaved-1f1b: plain 1f1b (interleaved_zb_order(P, M, 1) is ZB-H1's idea on it,
        # to register once the simulator and the runtime run I and W)
        return flush_schedule("interleaved-zb", shape, one_f_one_b_order)
    check_interleaved_shape("interleaved-zb", shape)
    chunks = shape.chunks
    return copies_schedule("interleaved-zb", shape, shape.layout(),
                           lambda P, M: interleaved_zb_order(P, M, chunks))


