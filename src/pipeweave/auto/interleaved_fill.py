"""Interleaved 1F1B's fill and drain per rank, on a partitioned plan (a lower bound).

:func:`~pipeweave.auto.bounds.plan_bound` counts each rank's work and each stage's chains,
which miss the interleaved bubble: at planning scale an interleaved plan simulated 20-26 %
above its plan bound. Megatron's order (``schedules.interleaved.interleaved_order``) fixes,
on rank ``r`` of ``P`` with ``v`` chunks and ``n`` micro-batches per copy (``total = n v``
virtual micro-batches, ``warmup = min(2 (P - r - 1) + (v - 1) P, total)`` forwards first):

- its first backward is ``B`` of its last chunk's stage ``s' = (v - 1) P + r`` for
  micro-batch 0, after ``k = min(warmup + 1, total)`` forwards (one steady forward
  precedes it); forward ``i`` is on chunk ``(i mod P v) div P``, so chunk ``c`` has run
  ``cnt_c = (k div P v) P + clamp(k mod P v - c P, 0, P)`` of its ``n`` forwards by then;
- that backward starts no earlier than micro-batch 0's forwards through every stage and
  its gradients back from the last stage to ``s' + 1``: ``sum_t f_t + sum_{t > s'} g_t``;
- from then on the rank runs all its ``n v`` backwards and the ``n - cnt_c`` forwards of
  each chunk left, one after another;
- its last action is ``B`` of stage ``r`` (chunk 0) for the last micro-batch, after which
  stage ``r``'s all-reduce and update run, or that gradient crosses stages ``r - 1 .. t``
  and stage ``t``'s all-reduce (with ``w > 1`` copies only) and update run (``closing``,
  as in the plan bound)::

    T  >=  sum_t f_t + sum_{t > s'} g_t + n sum_c b_{cP+r} + sum_c (n - cnt_c) f_{cP+r}
           + max over t <= r of (sum_{t <= u < r} g_u + AR_t + U_t)

Transfers and latencies are left out (they only lengthen the chains); each term is a
duration of the plan's costs, so recomputation (in the costs) only raises it. With one
chunk, per-stage replicas or ``n`` not a multiple of ``P`` the order differs: 0 (no bound).
``tests/auto/test_interleaved_fill.py`` checks the declared counts on the generated order
and the bound against the simulator on random costs.
"""

from __future__ import annotations

from ..planner.plan import Plan
from ..sim import StageCosts

__all__ = ["interleaved_fill_bound", "first_backward"]

SCHEDULES = ("interleaved-1f1b",)
"""The schedules whose order is Megatron's interleaved one with whole backwards."""


def first_backward(rank: int, ranks: int, chunks: int, n: int) -> tuple[int, tuple[int, ...]]:
    """Rank ``rank``'s first backward's stage and, per chunk, the forwards it has run
    before it (module docstring)."""
    total, group = n * chunks, ranks * chunks
    warmup = min(2 * (ranks - rank - 1) + (chunks - 1) * ranks, total)
    k = min(warmup + 1, total)
    counts = tuple((k // group) * ranks + min(max(k % group - c * ranks, 0), ranks)
                   for c in range(chunks))
    return (chunks - 1) * ranks + rank, counts


def interleaved_fill_bound(plan: Plan, table: StageCosts) -> float:
    """The largest over the ranks of one copy of the chain above (0 where it does not
    apply)."""
    chunks = plan.chunks
    stages = len(table.forward)
    if plan.schedule not in SCHEDULES or chunks < 2 or plan.pipelines != 1 \
            or stages % chunks or plan.microbatches % plan.width:
        return 0.0
    ranks = stages // chunks
    n = plan.microbatches // plan.width
    if n % ranks or plan.replicas is not None:
        return 0.0
    forward, backward = table.forward, table.backward
    forwards = sum(forward)
    behind = [0.0] * (stages + 1)  # behind[s]: sum of g_t over t >= s
    for s in range(stages - 1, -1, -1):
        behind[s] = behind[s + 1] + backward[s]
    reduces = plan.width > 1  # a stage all-reduces only among its copies
    best = 0.0
    closing = 0.0
    for rank in range(ranks):
        own = (table.all_reduce[rank] if reduces else 0.0) + table.update[rank]
        closing = max(closing + (backward[rank - 1] if rank else 0.0), own)
        first, counts = first_backward(rank, ranks, chunks, n)
        held = [c * ranks + rank for c in range(chunks)]
        work = sum(n * backward[s] + (n - count) * forward[s] for s, count in zip(held, counts))
        best = max(best, forwards + behind[first + 1] + work + closing)
    return best
