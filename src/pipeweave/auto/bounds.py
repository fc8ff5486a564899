"""Lower bounds on a candidate's iteration time, from the profile alone (no simulation).

Every rank runs its actions one after another, so a synchronous schedule's iteration (one
flush, the simulated makespan) lasts at least as long as the busiest rank's work::

    work(r) = sum over the stages s on r of  n_s * (F_s + min(B_s, I_s + W_s)) + U_s + AR_s
    n_s     = N * ceil(M / replicas of s)    (micro-batches one replica of s runs)

Stage ``s`` (any chunk of any rank: the chains below follow the stages, not the ranks)
cannot start before the first micro-batch has crossed the stages in front of it,
``head(s) = sum over t < s of (F_t / 2 + transfer_t / 2 + latency_t)`` (halved: the Slicer
forwards half micro-batches; ``latency_t`` is 0 where both stages are on one rank). Its
gradient action is ``g_s = B_s``, or ``min(B_s, I_s)`` for a schedule that splits backwards
(:attr:`ScheduleInfo.split_backward <pipeweave.schedules.ScheduleInfo.split_backward>`). Three chains, each a sequence of
actions that wait for one another::

    last gradient, back:  head(s) + n_s (F_s + g_s) + closing(s)
        closing(s) = max over t <= s of  sum over t <= u < s of (g_u + transfer_u +
                     latency_u)  +  AR_t + U_t
        (s's last gradient ends after its n_s forwards and gradients; that micro-batch's
        gradient still crosses the stages in front, and each of them all-reduces and
        updates after it: where the all-reduce dominates, the first stage's ends the
        iteration)
    first gradient:       head(s) + F_s / 2 + down(s) + n_s min(B_s, I_s + W_s) + AR_s + U_s
        down(s) = sum over t > s of (F_t / 2 + transfer / 2 + latency + g_t + transfer +
                  latency)   (a micro-batch's round trip behind s: no gradient of s earlier)
    last forward:         head(s) + n_s F_s + down(s) + g_s + AR_s + U_s

and the busiest rank starts no earlier than the earliest head of its stages::

    iteration >= max( max over r of min head(s on r) + work(r),  max over s of the chains )

With ``c`` shared cores the ranks' compute (not their all-reduces) needs at least
``total / c``. Before a candidate is partitioned only the model's totals are known: the work
of one copy spread over its ``d`` ranks (the all-reduce priced at the fastest link any
stage's replicas share, :func:`~pipeweave.auto.links.replica_bandwidths`; a sharded
candidate's per-block parameter gathers at that link too, in every F and, ``full``, every
backward), the heaviest block
on one rank, and the head-and-tail chain minimised over every split of the model into its
``S = d x chunks`` stages: with per-micro-batch cost ``C = sum of (F + g)`` and ``alpha`` the
smallest ratio of a block's chain cost ``F/2 + g`` to ``F + g``, stages ``c_0, c_1, ...``
(``S_s`` the cost before stage ``s``) need ``max_s alpha S_s + n c_s``, which no real split
beats and the continuous split that makes every term equal attains; the chain then closes
with the first stage's all-reduce and update, at least block 0's::

    T = alpha C / (1 - (1 - alpha / n)^S) + AR(block 0) + U(block 0)
                                                  (n C / S as n grows; n C at S = 1)

Recomputation adds each recomputing stage's forward to its backward. When every stage
recomputes the totals above include it block by block; when only the first ``k`` stages do,
before partitioning it is only known that they hold at least ``k`` blocks, so the work gains
``n`` times the ``k`` smallest block forwards (the fill bound and the heaviest block stay
without it); after partitioning the costs carry it per stage.

After partitioning, interleaved 1F1B's fill and drain per rank (each rank's first backward
waits for micro-batch 0's round trip, its last closes the chain back to stage 0) are
:func:`~pipeweave.auto.interleaved_fill.interleaved_fill_bound`'s, and the pace the
micro-batches 1F1B keeps open on each stage allow (Little's law, with both crossings of every
boundary) :func:`~pipeweave.auto.window_bound.declared_window_bound`'s.

The fill and drain of a schedule whose order declares its waits (1F1B: ``(n + S - 1) C / S``
on every split) are :func:`~pipeweave.auto.fill_bound.fill_bound`'s, closed the same way.

Asynchronous schedules are timed over a steady-state window of several iterations, which
these bounds do not cover, so they are never pruned on time (only on memory).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..planner.pipedream import allreduce_time
from ..planner.sharded_costs import ring_phase_time
from ..ir import Layout
from ..planner.plan import Plan
from ..schedules import get_info
from ..profiler import Profile
from ..sim import Costs, StageCosts
from .fill_bound import WINDOWS, fill_bound
from .interleaved_fill import interleaved_fill_bound
from .links import default_topology, replica_bandwidths
from .problem import AutoProblem, Candidate
from .reduce_fill import Blocks, contiguous_shares, reduce_fill_bound
from .window_bound import declared_window_bound

__all__ = ["shape_bound", "reduce_bound", "plan_bound", "round_trips"]


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
    first_parameters: float  # of block 0, which the first stage always holds
    first_update: float
    gathered: float  # sum over blocks of their parameter bytes (a sharded F gathers each)


_TOTALS: dict[tuple[int, bool, bool], tuple[Profile, _Totals]] = {}


def _totals(profile: Profile, recompute: bool, splits: bool) -> _Totals:
    key = (id(profile), recompute, splits)
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
        gradient = (min(gradient, b.backward) if splits else b.backward) + extra
        per_block.append(b.forward + gradient)
        chain.append(b.forward / 2 + gradient)
    first = profile.blocks[0]
    totals = _Totals(
        work=sum(work), heaviest=max(work), update=sum(b.update for b in profile.blocks),
        parameters=profile.stage_parameter_bytes(0, profile.num_blocks),
        chain_total=sum(per_block),
        alpha=min((c / w for c, w in zip(chain, per_block) if w > 0), default=1.0),
        smallest=tuple(itertools.accumulate(sorted(b.forward for b in profile.blocks),
                                            initial=0.0)),
        first_parameters=first.parameter_bytes, first_update=first.update,
        gathered=sum(b.parameter_bytes for b in profile.blocks))
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
    totals = _totals(profile, every, get_info(candidate.schedule).split_backward)
    extra = 0.0 if every else totals.smallest[min(candidate.recompute, profile.num_blocks)]
    per_replica = candidate.pipelines * -(-candidate.microbatches // candidate.width)
    update = totals.update * candidate.pipelines
    link = min(fastest_link, _replica_link(problem, candidate.depth, candidate.width))
    reduction = _reduction(candidate)
    reduce = reduction(totals.parameters, candidate.width, link) * candidate.pipelines
    copy = per_replica * (totals.work + extra + _gathers(candidate, totals, link)) \
        + update + reduce
    bound = copy / candidate.depth
    may_replicate = candidate.width == 1 and candidate.chunks == 1
    if not may_replicate:
        bound = max(bound, per_replica * totals.heaviest)
    if not may_replicate:
        # every split's chain ends with the first stage's all-reduce and update, and the
        # first stage holds block 0 at least
        closing = reduction(totals.first_parameters, candidate.width, link) \
            + totals.first_update
        bound = max(bound, _fill_bound(totals, per_replica, candidate.stages) + closing)
        if candidate.pipelines == 1 and candidate.chunks == 1 and not candidate.options:
            bound = max(bound, fill_bound(candidate.schedule, candidate.stages, per_replica,
                                          totals.work + extra) + closing)
    if problem.shared_cores is not None and problem.shared_cores < problem.ranks:
        total = candidate.pipelines * candidate.microbatches * (totals.work + extra) \
            + update * candidate.width
        bound = max(bound, total / problem.shared_cores)
    return bound


def reduce_bound(candidate: Candidate, profile: Profile, problem: AutoProblem) -> float:
    """The fill and drain with every stage's own all-reduce at the link its replicas cross
    (:func:`~pipeweave.auto.reduce_fill.reduce_fill_bound`, valid on every split, with or
    without recomputation), for a candidate whose schedule declares its windows; 0 for
    the others. Dearer than :func:`shape_bound` (a walk over the stages per grid point),
    so the search asks it only of a candidate the shape bound did not prune."""
    if candidate.schedule not in WINDOWS or candidate.chunks != 1 or candidate.width < 2 \
            or candidate.pipelines != 1 or candidate.options:
        return 0.0
    topology = problem.topology or default_topology(problem.profile, problem.ranks)
    links = replica_bandwidths(topology, candidate.depth, candidate.width)
    reduction = _reduction(candidate)
    per_byte = tuple(reduction(1.0, candidate.width, link) for link in links)
    n = -(-candidate.microbatches // candidate.width)
    return reduce_fill_bound(candidate.schedule, n, _blocks(profile), per_byte)


_BLOCKS: dict[int, tuple[Profile, Blocks]] = {}


def _blocks(profile: Profile) -> Blocks:
    """:class:`~pipeweave.auto.reduce_fill.Blocks` of ``profile`` (no recomputation)."""
    cached = _BLOCKS.get(id(profile))
    if cached is not None and cached[0] is profile:
        return cached[1]
    if len(_BLOCKS) > 256:
        _BLOCKS.clear()
    work, forward, held = [], [], []
    for index, b in enumerate(profile.blocks):
        split = (b.input_grad + b.weight_grad) if b.input_grad > 0 and b.weight_grad > 0 \
            else b.backward
        work.append(b.forward + min(b.backward, split))
        forward.append(b.forward)
        tied = sum(t.parameter_bytes for t in profile.ties if index in t.blocks)
        held.append(max(0.0, b.parameter_bytes - tied))
    positive = [i for i, w in enumerate(work) if w > 0]
    first, last = profile.blocks[0], profile.blocks[-1]
    blocks = Blocks(work=sum(work),
                  forward_share=min((forward[i] / work[i] for i in positive), default=0.0),
                  shares=contiguous_shares(work, held),
                  first=(work[0], held[0], first.update),
                  last=(work[-1], held[-1], last.update))
    _BLOCKS[id(profile)] = (profile, blocks)
    return blocks


def _reduction(candidate: Candidate) -> Callable[[float, int, float], float]:
    """The gradient reduction among a stage's copies: the all-reduce, or a sharded stage's
    reduce-scatter (one ring phase, :mod:`pipeweave.planner.sharded_costs`; its gathers are
    :func:`_gathers`)."""
    return allreduce_time if candidate.shard == "none" else ring_phase_time


def _gathers(candidate: Candidate, totals: _Totals, link: float) -> float:
    """Per micro-batch of a sharded candidate: the parameter all-gathers of every block in
    its forward and, sharded ``full``, again in its backward (a split backward's ``I`` and
    ``W`` each, so ``min(B + g, I + W + 2g) >= min(B, I + W) + g``), at the fastest link any
    stage's replicas share and without the message latencies
    (:mod:`pipeweave.planner.sharded_costs`: ring phases are linear in the bytes)."""
    if candidate.shard == "none" or candidate.width < 2:
        return 0.0
    gather = ring_phase_time(totals.gathered, candidate.width, link)
    return gather * (2.0 if candidate.shard == "full" else 1.0)


def _replica_link(problem: AutoProblem, depth: int, width: int) -> float:
    """The fastest link any stage's all-reduce among its ``width`` replicas runs at (copy
    ``k`` of the pipeline on ranks ``k * depth ..``, :mod:`pipeweave.auto.links`)."""
    if width <= 1:
        return math.inf
    topology = problem.topology or default_topology(problem.profile, problem.ranks)
    return max(replica_bandwidths(topology, depth, width))


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
    split = get_info(plan.schedule).split_backward
    latency = _latencies(layout, table)
    down = _round_trips(table, split, latency)
    head = closing = 0.0
    first_head = [math.inf] * layout.num_ranks  # the earliest any stage of a rank can start
    for s, ranks in enumerate(layout.stage_ranks):
        gradient = _gradient(table, s, split)
        backward = min(table.backward[s], table.input_grad[s] + table.weight_grad[s])
        per_replica = plan.pipelines * -(-plan.microbatches // len(ranks))
        own = table.all_reduce[s] + table.update[s]
        # after s's last gradient: its trip back to some stage t <= s, then t's all-reduce
        # and update
        closing = max(own, closing)
        # s's first gradient waits for a micro-batch's round trip behind it; then all of its
        # gradients, the all-reduce and the update are still to run
        first = head + table.forward[s] / 2 + down[s]
        bound = max(bound, head + per_replica * (table.forward[s] + gradient) + closing,
                    first + per_replica * backward + own,
                    head + per_replica * table.forward[s] + down[s] + gradient + own)
        for r in ranks:
            first_head[r] = min(first_head[r], head)
        if s < len(table.transfer):
            head += (table.forward[s] + table.transfer[s]) / 2 + latency[s]
            closing += table.transfer[s] + latency[s] + gradient
    bound = max(bound, max(h + w for h, w in zip(first_head, work)),
                interleaved_fill_bound(plan, table))  # Megatron's order, per rank
    cores = problem.shared_cores
    if cores is not None and cores < layout.num_ranks:
        bound = max(bound, compute / cores)
    else:  # the micro-batches 1F1B keeps open on each stage (auto/window_bound.py)
        bound = max(bound, declared_window_bound(plan, table))
    return bound if math.isfinite(bound) else 0.0


def round_trips(layout: Layout, table: StageCosts, split: bool) -> list[float]:
    """Per stage: the least time from the end of a micro-batch's forward there to the start of
    its gradient there (``down(s)`` of the module docstring), for any schedule of the plan
    (``split``: the schedule may split backwards)."""
    return _round_trips(table, split, _latencies(layout, table))


def _gradient(table: StageCosts, stage: int, split: bool) -> float:
    """The action that sends a stage's gradient back: ``B``, or at least ``I`` when the
    schedule may split it."""
    return min(table.backward[stage], table.input_grad[stage]) if split else table.backward[stage]


def _latencies(layout: Layout, table: StageCosts) -> list[float]:
    """Per boundary: the latency a message pays crossing it (none between two stages on
    one rank, the V's turn)."""
    ranks = layout.stage_ranks
    return [0.0 if set(ranks[s]) & set(ranks[s + 1]) else table.latency
            for s in range(len(ranks) - 1)]


def _round_trips(table: StageCosts, split: bool, latency: list[float]) -> list[float]:
    """Per stage ``s``: the least time from the end of a micro-batch's forward on ``s`` to the
    start of its gradient there: its forward on every later stage (a Slicer half: half of
    it, and half the transfer), the gradient on each of them, and both crossings of each
    boundary (module docstring)."""
    stages = len(table.forward)
    down = [0.0] * stages
    for s in range(stages - 2, -1, -1):
        t = s + 1
        forward = (table.forward[t] + table.transfer[s]) / 2 + latency[s]
        back = _gradient(table, t, split) + table.transfer[s] + latency[s]
        down[s] = down[t] + forward + back
    return down
