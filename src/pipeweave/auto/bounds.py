"""Lower bounds on a candidate's iteration time, from the profile alone (no simulation).

Every rank runs its actions one after another, so a synchronous schedule's iteration (one
flush, the simulated makespan) lasts at least as long as the busiest rank's work::

    work(r) = sum over the stages s on r of  n_s * (F_s + min(B_s, I_s + W_s)) + U_s + AR_s
    n_s     = N * ceil(M / replicas of s)    (micro-batches one replica of s runs)

Rank ``r`` of a one-chunk pipeline cannot start before the first micro-batch has crossed
the stages in front of it, ``head(r) = sum over s < r of (F_s / 2 + transfer_s / 2 +
latency)`` (halved: the Slicer forwards half micro-batches), and after its last gradient
action (``B``, or ``I`` in a split backward: all its ``n_r`` forwards and gradients are done by
then) that micro-batch's gradient still has to cross the stages in front of it, ``tail(r) =
sum over s < r of (g_s + latency)`` with ``g = min(B, I)``::

    iteration >= max over r of  head(r) + max(work(r), n_r * (F_r + g_r) + tail(r))

With ``c`` shared cores the ranks' compute (not their all-reduces) needs at least
``total / c``. Before a candidate is partitioned only the model's totals are known: the work
of one copy spread over its ``d`` ranks, the heaviest block on one rank, and the same
head-and-tail bound minimised over every split of the model into ``d`` stages: with
per-micro-batch cost ``C = sum of (F + g)`` and ``alpha`` the smallest ratio of a block's
chain cost ``F/2 + g`` to ``F + g``, stages ``c_0, c_1, ...`` (``S_r`` the cost before stage
``r``) need ``max_r alpha S_r + n c_r``, which no real split beats and the continuous split
that makes every term equal attains::

    T = alpha C / (1 - (1 - alpha / n)^d)         (n C / d as n grows; n C at d = 1)

Recomputation adds each recomputing stage's forward to its backward. When every stage
recomputes the totals above include it block by block; when only the first ``k`` stages do,
before partitioning it is only known that they hold at least ``k`` blocks, so the work gains
``n`` times the ``k`` smallest block forwards (the fill bound and the heaviest block stay
without it); after partitioning the costs carry it per stage.

Asynchronous schedules are timed over a steady-state window of several iterations, which
these bounds do not cover, so they are never pruned on time (only on memory).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..planner.pipedream import allreduce_time
from ..planner.plan import Plan
from ..profiler import Profile
from ..sim import Costs
from .problem import AutoProblem, Candidate

__all__ = ["shape_bound", "plan_bound"]


@dataclass(frozen=True)
class _Totals:
    """What the shape bound needs from a (scaled) profile, summed once."""

    work: float      # sum over blocks of F + min(B, I + W)  (+ F when recomputed)
    heaviest: float  # the largest of those
    update: float
    parameters: float
    chain_total: float  # sum of F + g   (g = min(B, I), + F when recomputed)
    alpha: float        # min over blocks of (F/2 + g) / (F + g)
    smallest: tuple[float, ...]  # [k]: the sum of the k smallest block forwards


_TOTALS: dict[tuple[int, bool], tuple[Profile, _Totals]] = {}


def _totals(profile: Profile, recompute: bool) -> _Totals:
    key = (id(profile), recompute)
    cached = _TOTALS.get(key)
    if cached is not None and cached[0] is profile:
        return cached[1]
    work, per_block, chain = [], [], []
    for b in profile.blocks:
        split = (b.input_grad + b.weight_grad) if b.input_grad > 0 and b.weight_grad > 0 \
            else b.backward
        extra = b.forward if recompute else 0.0
        work.append(b.forward + min(b.backward, split) + extra)
        gradient = min(b.backward, b.input_grad) if b.input_grad > 0 else b.backward / 2
        gradient = min(gradient, b.backward) + extra
        per_block.append(b.forward + gradient)
        chain.append(b.forward / 2 + gradient)
    totals = _Totals(
        work=sum(work), heaviest=max(work), update=sum(b.update for b in profile.blocks),
        parameters=profile.stage_parameter_bytes(0, profile.num_blocks),
        chain_total=sum(per_block),
        alpha=min((c / w for c, w in zip(chain, per_block) if w > 0), default=1.0),
        smallest=tuple(itertools.accumulate(sorted(b.forward for b in profile.blocks),
                                            initial=0.0)))
    if len(_TOTALS) > 256:
        _TOTALS.clear()
    _TOTALS[key] = (profile, totals)
    return totals


def _fill_bound(totals: _Totals, n: int, depth: int) -> float:
    """``alpha C / (1 - (1 - alpha/n)^d)`` (module docstring)."""
    if totals.chain_total <= 0:
        return 0.0
    alpha = totals.alpha
    return alpha * totals.chain_total / (1.0 - (1.0 - alpha / n) ** depth)


def shape_bound(candidate: Candidate, profile: Profile, problem: AutoProblem,
                fastest_link: float) -> float:
    """A lower bound before partitioning (``profile`` scaled to the micro-batch)."""
    every = candidate.recompute >= candidate.stages
    totals = _totals(profile, every)
    extra = 0.0 if every else totals.smallest[min(candidate.recompute, profile.num_blocks)]
    per_replica = candidate.pipelines * -(-candidate.microbatches // candidate.width)
    update = totals.update * candidate.pipelines
    reduce = allreduce_time(totals.parameters, candidate.width, fastest_link) \
        * candidate.pipelines
    copy = per_replica * (totals.work + extra) + update + reduce
    bound = copy / candidate.depth
    may_replicate = candidate.width == 1 and candidate.chunks == 1
    if not may_replicate:
        bound = max(bound, per_replica * totals.heaviest)
    if candidate.chunks == 1 and not may_replicate:
        bound = max(bound, _fill_bound(totals, per_replica, candidate.depth))
    if problem.shared_cores is not None and problem.shared_cores < problem.ranks:
        total = candidate.pipelines * candidate.microbatches * (totals.work + extra) \
            + update * candidate.width
        bound = max(bound, total / problem.shared_cores)
    return bound


def plan_bound(plan: Plan, costs: Costs, problem: AutoProblem) -> float:
    """A lower bound for a partitioned candidate (module docstring)."""
    layout = plan.layout()
    table = costs.resolve(len(plan.stages))
    work = [0.0] * layout.num_ranks
    compute = 0.0  # what shares the cores: F, B (I, W) and U, not the all-reduce
    for s, ranks in enumerate(layout.stage_ranks):
        per_replica = plan.pipelines * -(-plan.microbatches // len(ranks))
        split = table.input_grad[s] + table.weight_grad[s]
        busy = (per_replica * (table.forward[s] + min(table.backward[s], split))
                + plan.pipelines * table.update[s])
        for r in ranks:
            work[r] += busy + plan.pipelines * table.all_reduce[s]
            compute += busy
    bound = max(work)
    if plan.chunks == 1:
        head = tail = 0.0
        for s, ranks in enumerate(layout.stage_ranks):
            gradient = min(table.backward[s], table.input_grad[s])
            per_replica = plan.pipelines * -(-plan.microbatches // len(ranks))
            for r in ranks:
                bound = max(bound, head + work[r],
                            head + per_replica * (table.forward[s] + gradient) + tail)
            if s < len(table.transfer):
                head += (table.forward[s] + table.transfer[s]) / 2 + table.latency
                tail += gradient + table.latency
    cores = problem.shared_cores
    if cores is not None and cores < layout.num_ranks:
        bound = max(bound, compute / cores)
    return bound if math.isfinite(bound) else 0.0
