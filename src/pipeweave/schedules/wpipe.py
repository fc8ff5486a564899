"""WPipe's double-grouped weight updates (2GW): two model chunks per rank, one of them delayed.

The model is cut into ``2P`` stages in two groups on the same ``P`` ranks (wpipe.txt §3.2,
Fig. 4a; :meth:`Layout.chunked`)::

    G0 = stages 0 .. P-1   on ranks 0 .. P-1      (first half of the model)
    G1 = stages P .. 2P-1  on ranks 0 .. P-1      (second half)

so every boundary crosses ranks, as the paper's count ``C_WPipe = 2(2N_s - 1) C_a`` assumes.
A micro-batch's G1 forward and backward form a "V" (down the ranks, back up), but its G0
forward and backward are split by the G1 work. §3.2 moves the G0 forwards of update period
``t+1`` in front of the G0 backwards of period ``t``: the pair ``[F0 of t+1, B0 of t]`` is a V
as well (Fig. 4b). The schedule cross-splices the V's as ``P(P(G0), P(G1))`` (Fig. 4c): per
period, a block of ``M`` G1 V's (the period's forwards and backwards of G1, one weight
version, flushed like data parallelism) and then a block of ``M`` G0 V's, which fills exactly
the idle time that separating G1's periods needs (§3.1: at least ``P(xV_n), x >= n-1``, so
``M >= P``). Consecutive V's start two steps apart; V number ``u`` occupies rank ``r`` at step
``2u + r`` going down and ``2u + 2P - 1 - r`` coming up, so after warm-up every rank alternates
G0 and G1 work without bubbles (Fig. 5). Rank order is the step order.

P=2, M=2, K=2 (``F0``/``B0``: G0 stage, ``F1``/``B1``: G1 stage; ``.3`` = micro-batch 3)::

    step   0    1    2    3    4    5    6    7    8    9    10   11   12   13   14   15
    rank0  F0.0      F0.1      F1.0      F1.1 B1.0 F0.2 B1.1 F0.3 B0.0 F1.2 B0.1 F1.3 B1.2 ...
    rank1       F0.0      F0.1      F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 ...

Weight versions (Eq. 1, ``w^{t+1} = w^t - lr * grad f(w^{t-1+i})`` for group ``i``):

* G1 (i=1): every forward and backward of period ``t`` uses version ``t``; its update
  ``U@t+1`` follows the period's last G1 backward — the semantics of data parallelism.
* G0 (i=0): the forwards of period ``t`` run before the update of period ``t-1`` lands, so they
  use version ``max(t-1, 0)`` and their backwards use that stashed version; ``U@t+1`` follows
  period ``t``'s last G0 backward. G0 holds two versions at once (one delay term, like 2BW).

The groups update alternately: G1 after its block, G0 after the next block. With
``width = w`` (WPipe's depth x width hybrid, §3.4, Fig. 6) there are ``w`` copies of this
pipeline (:meth:`Layout.data_parallel` with two chunks); micro-batch ``j`` runs on copy
``j % w`` and every update is preceded by an all-reduce (``AR``) among the copies.

Memory (Table 1, counted by the tests from the schedule): G0 stages hold two weight versions,
G1 stages one, i.e. a weight buffer of ``S_m``. While G1 works, a G0 stage holds the ``M``
activations of the next period and G1 stage ``P+i`` holds ``min(P-i, M)``; rank ``i`` holds
at most ``M + P - i`` chunk activations at any time, which is the paper's ``2M - i`` per stage
and ``(4M - N + 1)/4 S_a`` in total for ``M = N`` (the case its formulas describe, like its
2BW row). With recomputation a rank materialises one chunk activation at a time: ``0.5 S_a``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Layout, Op, Schedule
from .common import routed, update_actions
from .registry import Shape, register

__all__ = ["wpipe", "wpipe_programs"]

_Event = tuple[float, Action]


def _min_microbatches(shape: Shape) -> int:
    return shape.stages * shape.width


@register("wpipe", description="WPipe 2GW: two chunks per rank, G1 synchronous, G0 forwards of the "
                               "next period before G0 backwards (two versions); updates alternate",
          paper="WPipe (wpipe.txt §3.2, Fig. 4-5, Eq. 1, Table 1)", synchronous=False,
          min_microbatches=_min_microbatches)
def wpipe(shape: Shape) -> Schedule:
    _check(shape)
    layout = Layout.data_parallel(shape.stages, shape.width, chunks=2)
    P, M = shape.stages, shape.microbatches
    programs: list[list[Action]] = []
    for copy in range(shape.width):
        first_rank = copy * P
        periods = [routed(layout, 0, first_rank, range(t * M, (t + 1) * M))
                   for t in range(shape.iterations)]
        programs.extend(wpipe_programs(layout, P, periods))
    return Schedule(
        name="wpipe", layout=layout, microbatches=M, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=False, options=dict(shape.options),
    )


def wpipe_programs(
    layout: Layout, ranks: int, periods: Sequence[Sequence[int]]
) -> list[list[Action]]:
    """Programs of the ``ranks`` ranks of one pipeline copy (its rank ``r`` runs stages ``r``
    and ``ranks + r``; the copy's ranks come from where the caller puts the programs).

    ``periods[t]`` lists the micro-batches of update period ``t`` (all of the same length,
    at least ``ranks``). Each action gets the step at which the paper's splice runs it
    (module docstring); a rank's program is its actions in step order.
    """
    P = ranks
    events: list[list[_Event]] = [[] for _ in range(P)]
    unit = 0

    def down(r: int) -> float:
        return 2 * unit + r

    def up(r: int) -> float:
        return 2 * unit + 2 * P - 1 - r

    def step_after(r: int, stage: int, version: int, at: float) -> None:
        # the update right after the last backward of the block (before the next action)
        for n, action in enumerate(update_actions(layout, stage, version)):
            events[r].append((at + 0.25 + 0.01 * n, action))

    # warm-up: period 0's G0 forwards, down-only V's (nothing to backward yet)
    for j in periods[0]:
        for r in range(P):
            events[r].append((down(r), Action(Op.FORWARD, r, j, version=0)))
        unit += 1
    for t, batch in enumerate(periods):
        # G1 block: period t's V's, one version (t), then G1's update t+1
        for j in batch:
            for r in range(P):
                events[r].append((down(r), Action(Op.FORWARD, P + r, j, version=t)))
                events[r].append((up(r), Action(Op.BACKWARD, P + r, j, version=t)))
            unit += 1
        for r in range(P):
            step_after(r, P + r, t + 1, 2 * (unit - 1) + 2 * P - 1 - r)
        # G0 block: V's [forward of period t+1 (version t), backward of period t (stashed)]
        following = periods[t + 1] if t + 1 < len(periods) else None
        for i, j in enumerate(batch):
            for r in range(P):
                if following is not None:
                    events[r].append((down(r), Action(Op.FORWARD, r, following[i], version=t)))
                events[r].append((up(r), Action(Op.BACKWARD, r, j, version=max(t - 1, 0))))
            unit += 1
        for r in range(P):
            step_after(r, r, t + 1, 2 * (unit - 1) + 2 * P - 1 - r)
    return [[action for _, action in sorted(rank_events, key=lambda e: e[0])]
            for rank_events in events]


def _check(shape: Shape) -> None:
    if shape.chunks not in (1, 2):
        raise ValueError(f"wpipe always holds 2 chunks per rank (groups G0 and G1), got "
                         f"chunks={shape.chunks}; omit chunks or set it to 2")
    if shape.replicas is not None:
        raise ValueError("wpipe does not support per-stage replicas; use width for WPipe's "
                         "depth x width hybrid")
    if shape.pipelines != 1:
        raise ValueError(f"wpipe runs one pipeline, got pipelines={shape.pipelines}; set it to 1")
    per_copy, rest = divmod(shape.microbatches, shape.width)
    if rest or per_copy < shape.stages:
        need = shape.stages * shape.width
        raise ValueError(
            f"wpipe needs microbatches (M={shape.microbatches}) divisible by width "
            f"({shape.width}) with at least P={shape.stages} per copy: a period of G1 must be "
            f"at least as long as the idle time it fills (wpipe.txt §3.1, M >= N); use a "
            f"multiple of {shape.width} that is >= {need}"
        )
