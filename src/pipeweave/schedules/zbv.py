"""ZB-V: the zero-bubble V schedule (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).

Two chunks per rank in a V (:mod:`.v_shape`), every backward split into ``I`` (input gradient,
what the previous stage waits for) and ``W`` (weight gradient, free to fill a bubble). The
paper's claims, at equal pass times ``F = I = W``: no bubble in the steady state, and the same
peak activation memory as 1F1B, ``P`` stage units on the fullest rank. The unit (as in
:mod:`.v_shape`): a *chunk activation* is what one micro-batch leaves on one chunk between its
``F`` and its ``W``, half a stage's since a chunk is half a stage; two make a *stage unit*, in
which 1F1B's first rank holds ``P``. So the cap here is ``2P`` chunk activations.

The order is found by list scheduling at unit cost, one pass per unit time, messages free,
every rank at once. At each step a rank starts the first of these passes that is *ready*
(its inputs arrived) and *admitted*:

1. the forward ``F`` of chunk 1 (stage ``2P-1-r``), admitted while the rank holds fewer than
   ``2P`` chunk activations;
2. the input gradient ``I`` of chunk 1;
3. the forward of chunk 0 (stage ``r``), admitted while it holds fewer than ``2P - 1``: the last
   place is kept for chunk 1, so the oldest micro-batch can always climb back up the V;
4. the input gradient of chunk 0;
5. a weight gradient ``W``: the oldest micro-batch's whose ``I`` is done (chunk 0 first).

Each chunk's forwards and input gradients go in micro-batch order. A chunk activation is held
from its ``F`` to its ``W``, so no rank ever holds more than ``2P``: 1F1B's ``P`` on its first
rank, here on every rank (the V balances memory). Rank ``P-1`` cannot start before step
``P-1`` and has ``6M`` passes, so an iteration takes at least ``6M + P - 1`` steps. For
``M >= P`` this order takes ``6M + P - 1 + e`` with ``0 <= e <= P - 2`` (checked for ``P <= 8``
and ``M`` up to ``10P``): ``e = 0`` at ``M = P``, and at every ``M >= 2P`` when ``P <= 4``.
``e`` does not grow with ``M``: the steady state has no bubble, and an iteration pays ``P - 1``
(+ ``e``) steps of fill where 1F1B pays ``6(P - 1)`` in the same unit (a full stage's ``F + B``
is six chunk passes).

P=2, M=4 (stages 0,3 on rank 0 and 1,2 on rank 1), unit-cost timeline; iteration time 25 =
6M + P - 1, rank 0 holding 0F0..0F2 and 3F0 (four chunk activations) at step 4::

    rank0  0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 0I0 0W0 0I1 0W1 0F3 3F2 3I2 3W1 3W2 .   3F3 3I3 0I2 0W2 0I3 0W3 3W3
    rank1  .   1F0 2F0 1F1 2F1 2I0 1I0 1W0 2I1 1I1 2W0 1F2 2F2 1W1 2W1 2I2 1F3 2F3 1I2 1W2 2I3 1I3 2W2 1W3 2W3

Lowering merges an ``I`` directly followed by its ``W`` into ``B`` (``0I0 0W0`` above: stage 0
sends no gradient). With ``chunks=1`` the schedule is plain ``1f1b``.
"""

from __future__ import annotations

import heapq

from ..ir import Op, Schedule
from .registry import Shape, register
from .v_shape import Pass, v_schedule

__all__ = ["zbv", "zbv_order"]

_NEVER = float("inf")


def zbv_order(P: int, M: int) -> list[list[Pass]]:
    """Every rank's passes of one iteration of ``M`` micro-batches (module docstring's rule)."""
    last = 2 * P - 1
    forward_done = [[_NEVER] * M for _ in range(2 * P)]  # step at which each pass has finished
    input_done = [[_NEVER] * M for _ in range(2 * P)]
    next_forward = [[0, 0] for _ in range(P)]  # per rank and chunk: next micro-batch
    next_input = [[0, 0] for _ in range(P)]
    weights: list[list[tuple[int, int]]] = [[] for _ in range(P)]  # heap of (i, chunk) after I
    held = [0] * P
    orders: list[list[Pass]] = [[] for _ in range(P)]
    remaining, t = 6 * M * P, 0
    while remaining:
        started = 0
        for r in range(P):
            stages = (r, last - r)
            choice = _pick(t, stages, M, held[r], 2 * P, next_forward[r], next_input[r],
                           weights[r], forward_done, input_done)
            if choice is None:
                continue
            op, chunk, i = choice
            stage = stages[chunk]
            if op is Op.FORWARD:
                next_forward[r][chunk] += 1
                forward_done[stage][i] = t + 1
                held[r] += 1
            elif op is Op.BACKWARD_INPUT:
                next_input[r][chunk] += 1
                input_done[stage][i] = t + 1
                heapq.heappush(weights[r], (i, chunk))
            else:
                heapq.heappop(weights[r])
                held[r] -= 1
            orders[r].append((op, stage, i))
            started += 1
        # everything started before t has finished by t, so a step where no rank can start
        # anything would repeat forever; the reserved place for chunk 1 rules that out
        assert started, (P, M, t)
        remaining -= started
        t += 1
    return orders


def _pick(t: int, stages: tuple[int, int], M: int, held: int, cap: int, next_forward: list[int],
          next_input: list[int], weights: list[tuple[int, int]], forward_done: list[list[float]],
          input_done: list[list[float]]) -> tuple[Op, int, int] | None:
    """The pass one rank starts at step ``t``: ``(op, chunk, i)``, or None to idle."""
    last = len(forward_done) - 1
    for op, chunk in _PRIORITY:
        stage = stages[chunk]
        if op is Op.FORWARD:
            i = next_forward[chunk]
            limit = cap if chunk == 1 else cap - 1
            if i < M and held < limit and (stage == 0 or forward_done[stage - 1][i] <= t):
                return op, chunk, i
        else:
            i = next_input[chunk]
            if (i < M and forward_done[stage][i] <= t
                    and (stage == last or input_done[stage + 1][i] <= t)):
                return op, chunk, i
    if weights:
        i, chunk = weights[0]
        return Op.BACKWARD_WEIGHT, chunk, i
    return None


_PRIORITY = ((Op.FORWARD, 1), (Op.BACKWARD_INPUT, 1), (Op.FORWARD, 0), (Op.BACKWARD_INPUT, 0))


@register("zbv", description="ZB-V: two chunks per rank in a V, backward split into I and W, "
                             "W filling bubbles; 1F1B's peak activation memory, flush per iteration",
          paper="P. Qi, X. Wan, G. Huang, M. Lin, Zero Bubble Pipeline Parallelism, ICLR 2024 "
                "(ZB-V schedule)",
          synchronous=True, default_chunks=2, placement="v",
          width=True, replicas=True, chunks=(1, 2), split_backward=True, torch_schedule="ZBVZeroBubble")
def zbv(shape: Shape) -> Schedule:
    return v_schedule("zbv", shape, zbv_order)
