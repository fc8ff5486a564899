"""Lower bounds on a candidate's iteration time, from the profile alone (no simulation).

Every rank runs its actions one after another, so a synchronous schedule's iteration (one
flush, the simulated makespan) lasts at least as long as the busiest rank's work::

    work(r) = sum over the stages s on r of  n_s * (F_s + min(B_s, I_s + W_s)) + U_s + AR_s
    n_s     = N * ceil(M / replicas of s)    (micro-batches one replica of s runs)

and rank ``r`` of a one-chunk pipeline cannot start before the first micro-batch has crossed
the stages in front of it: ``head(r) = sum over s < r of (F_s + transfer_s) / 2`` (halved,
since the Slicer forwards half micro-batches). With ``c`` shared cores the whole work of all
ranks' compute (not their all-reduces) needs at least ``total / c``. Before a candidate is partitioned only averages are known:
the work of one pipeline copy spread over its ``d`` ranks, and the heaviest block on one rank.

Asynchronous schedules are timed over a steady-state window of several iterations, which
these bounds do not cover, so they are never pruned on time (only on memory).
"""

from __future__ import annotations

import math

from ..planner.pipedream import allreduce_time
from ..planner.plan import Plan
from ..profiler import Profile
from ..sim import Costs
from .problem import AutoProblem, Candidate

__all__ = ["shape_bound", "plan_bound"]


def _block_work(profile: Profile, recompute: bool) -> list[float]:
    out = []
    for b in profile.blocks:
        split = (b.input_grad + b.weight_grad) if b.input_grad > 0 and b.weight_grad > 0 \
            else b.backward
        out.append(b.forward + min(b.backward, split) + (b.forward if recompute else 0.0))
    return out


def shape_bound(candidate: Candidate, profile: Profile, problem: AutoProblem,
                fastest_link: float) -> float:
    """A lower bound before partitioning (``profile`` scaled to the micro-batch)."""
    work = _block_work(profile, candidate.recompute)
    per_replica = candidate.pipelines * -(-candidate.microbatches // candidate.width)
    update = sum(b.update for b in profile.blocks) * candidate.pipelines
    params = sum(b.parameter_bytes for b in profile.blocks)
    reduce = allreduce_time(params, candidate.width, fastest_link) * candidate.pipelines
    copy = per_replica * sum(work) + update + reduce
    bound = copy / candidate.depth
    may_replicate = candidate.width == 1 and candidate.chunks == 1
    if not may_replicate:
        bound = max(bound, per_replica * max(work))
    if problem.shared_cores is not None and problem.shared_cores < problem.ranks:
        total = candidate.pipelines * candidate.microbatches * sum(work) + update * candidate.width
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
        head = 0.0
        for s, ranks in enumerate(layout.stage_ranks):
            for r in ranks:
                bound = max(bound, head + work[r])
            if s < len(table.transfer):
                head += (table.forward[s] + table.transfer[s]) / 2 + table.latency
    cores = problem.shared_cores
    if cores is not None and cores < layout.num_ranks:
        bound = max(bound, compute / cores)
    return bound if math.isfinite(bound) else 0.0
