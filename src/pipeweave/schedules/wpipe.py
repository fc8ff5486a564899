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

P=2, M=2, K=2, unit-cost timeline (stages 0-1 are G0, 2-3 are G1; period 0 is micro-batches
0-1, period 1 is 2-3; ``0F2``/``0F3`` run before ``0B0``/``0B1``)::

    rank0  0F0 0F1 2F0 2F1 .   2B0 0F2 2B1 0F3 0B0 2F2 0B1 2F3 2B2 .   2B3 0B2 0B3
    rank1  .   1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 .

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
G1 stages one, so the weight buffer is ``2 x S_m/2 = S_m``. §3.3 splits the activations of
rank ``i`` into ``M`` for G0 (a period's forwards waiting for their backwards) and ``M - i`` for
G1. Counted from the schedule, rank ``i`` holds at most ``M + P - i`` chunk activations at once:
G1 stage ``P+i`` at most ``min(P - i, M)``, and the G0 stage ``M`` while G1 runs (up to
``M + P - i`` when the next period's forwards overlap this period's backwards and G1 is done).
For ``M = N``, the case the paper's formulas describe (like its 2BW row), that is ``2M - i``
per stage and ``(4M - N + 1)/4 S_a`` in all. With recomputation a rank materialises one
chunk's activations at a time: ``N x S_a/2N = 0.5 S_a``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Layout, Op, Schedule
from .async_common import DRAIN, drain_segments
from .common import routed, update_actions
from .corrections import NESTEROV, WARMUP
from .registry import Shape, register

__all__ = ["wpipe", "wpipe_programs"]

_Event = tuple[float, Action]


def _min_microbatches(shape: Shape) -> int:
    return shape.stages * shape.width


@register("wpipe", description="WPipe 2GW: two chunks per rank, G1 synchronous, G0 forwards of the "
                               "next period before G0 backwards (two versions); updates alternate",
          paper="P. Yang et al., Group-based Interleaved Pipeline Parallelism for Large-scale DNN Training (WPipe), ICLR 2022, §3.2, Eq. 1", synchronous=False,
          min_microbatches=_min_microbatches, default_chunks=2, options=(DRAIN, WARMUP, NESTEROV),
          width=True, chunks=(2,), checkpointable=True)
def wpipe(shape: Shape) -> Schedule:
    _check(shape)
    layout = Layout.data_parallel(shape.stages, shape.width, chunks=2)
    P, M = shape.stages, shape.microbatches
    programs: list[list[Action]] = []
    segments = drain_segments("wpipe", shape)
    for copy in range(shape.width):
        first_rank = copy * P
        copy_programs: list[list[Action]] = [[] for _ in range(P)]
        for segment in segments:  # a drain: each segment starts afresh on the weights reached
            periods = [routed(layout, 0, first_rank, range(t * M, (t + 1) * M)) for t in segment]
            for program, part in zip(copy_programs, wpipe_programs(layout, P, periods,
                                                                   first_version=segment.start)):
                program.extend(part)
        programs.extend(copy_programs)
    return Schedule(
        name="wpipe", layout=layout, microbatches=M, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=False, options=dict(shape.options),
    )


def wpipe_programs(
    layout: Layout, ranks: int, periods: Sequence[Sequence[int]], *, first_version: int = 0,
) -> list[list[Action]]:
    """Programs of the ``ranks`` ranks of one pipeline copy (its rank ``r`` runs stages ``r``
    and ``ranks + r``; the copy's ranks come from where the caller puts the programs).

    ``periods[t]`` lists the micro-batches of update period ``t`` (all of the same length,
    at least ``ranks``). Each action gets the step at which the paper's splice runs it
    (module docstring); a rank's program is its actions in step order. ``first_version``: the
    version both groups hold when ``periods[0]`` starts (after a drain; period ``t`` here is
    update period ``first_version + t`` of the run).
    """
    P = ranks
    v0 = first_version
    events: list[list[_Event]] = [[] for _ in range(P)]
    unit = 0

    def down(r: int) -> float:
        return 2 * unit + r

    def up(r: int) -> float:
        return 2 * unit + 2 * P - 1 - r

    def update_after_block(r: int, stage: int, version: int) -> None:
        # half a step after the block's last V comes back up through rank r
        at = 2 * (unit - 1) + 2 * P - 1 - r + 0.5
        for n, action in enumerate(update_actions(layout, stage, version)):
            events[r].append((at + 0.01 * n, action))

    # warm-up: period 0's G0 forwards, down-only V's (nothing to backward yet)
    for j in periods[0]:
        for r in range(P):
            events[r].append((down(r), Action(Op.FORWARD, r, j, version=v0)))
        unit += 1
    for t, batch in enumerate(periods):
        # G1 block: period t's V's, one version (t), then G1's update t+1
        for j in batch:
            for r in range(P):
                events[r].append((down(r), Action(Op.FORWARD, P + r, j, version=v0 + t)))
                events[r].append((up(r), Action(Op.BACKWARD, P + r, j, version=v0 + t)))
            unit += 1
        for r in range(P):
            update_after_block(r, P + r, v0 + t + 1)
        # G0 block: V's [forward of period t+1 (version t), backward of period t (stashed)]
        following = periods[t + 1] if t + 1 < len(periods) else None
        for i, j in enumerate(batch):
            for r in range(P):
                if following is not None:
                    events[r].append((down(r), Action(Op.FORWARD, r, following[i], version=v0 + t)))
                events[r].append((up(r), Action(Op.BACKWARD, r, j, version=v0 + max(t - 1, 0))))
            unit += 1
        for r in range(P):
            update_after_block(r, r, v0 + t + 1)
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
