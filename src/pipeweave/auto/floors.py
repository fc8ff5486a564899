"""Memory floors that need no schedule: the model state spread evenly, and the activations
a plan must hold to be fast.

:func:`~pipeweave.auto.memory.static_memory` prunes a candidate once its partition method has
run; a method can cost seconds at planning scale (AutoPipe simulates the 1F1B of each split
it tries, PipeDream runs its dynamic program), so a shape whose model state cannot fit on any
split is pruned here first, for every method and recomputation of it at once.

One copy of the pipeline spreads the model's ``S = d x chunks`` stages over its ``d`` ranks
(PipeDream's replicated stages over ``d`` ranks too, with ``w = 1``: replicas only add
bytes). Rank ``r`` holds, in each of ``N`` pipelines, its stages' parameters ``|w_s|``, as
many gradient bytes and their optimizer state ``k_s``
(:func:`pipeweave.memory.model_state`, which :func:`~pipeweave.auto.memory.static_memory`
takes whole). Every stage is on some rank and the maximum is at least the mean, so::

    max over r of static(r)  >=  (1 / d) sum over r of static(r)
                             >=  N (2 |W| + K) / d

with ``|W|`` the model's parameter bytes, each tie once (``stage_parameter_bytes(0, n)``: a
split counts a tie at least once, in the stage holding it) and ``K`` the blocks' optimizer
state summed; a profile with ties counts no optimizer state here, since a stage holding both
ends of a tie holds its state once (``planner.memory._held_share``) and this floor stays
below every split. A candidate with ``N (2 |W| + K) / d`` over the memory limit has every
split over it, so it is pruned before its method runs.

A candidate sharded over its ``w`` copies (``shard`` ``full`` or ``grad-op``) keeps ``1/w`` of
the parameters and optimizer state, its gradients whole until the reduce-scatter, and
gathered parameters besides (:class:`pipeweave.memory.Sharding`),
so its floor is ``N ((1 + 1/w) |W| + K / w) / d``, leaving out what it gathers.

The same mean bounds :func:`~pipeweave.auto.held_floor.held_floor` over every split, for a
synchronous candidate of one pipeline that cannot replicate a stage (``w > 1`` or several
chunks: every stage on one rank of each copy) and recomputes nothing. Rank ``r`` of copy 0
holds at least its parameters and optimizer state and, at one moment, its stages' largest
``a_s c_s`` (``c_s`` the micro-batches stage ``s`` surely holds, at least ``c =`` their least
over the stages; ``a_s`` at least the saved bytes of the stage's blocks, and the ``S`` stages
take every block), so with ``k`` chunks a rank and ``share = 1/w`` sharded (else 1)::

    max over r of held_floor(r)  >=  (share (|W| + K) + c sum over blocks of a_b / k) / d

which at planning scale prunes the zero-bubble and GPipe shapes (``c`` = ``P`` to ``M``)
whose activations cannot fit on any split before a partition method runs.

Two per-rank floors sharpen it (:meth:`StateFloor.held`), both on every split:

- **The ends.** The last stage always holds the model's last block and the first stage
  its first, whatever the method: unless the last stage recomputes (``recompute >= S``),
  the rank holding it keeps at least ``c_{S-1} a_last`` (a stage's saved bytes include
  each of its blocks', :func:`~pipeweave.planner.memory.stage_activation_bytes`), and, with
  no recomputation, the first stage's rank at least ``c_0 a_0``. At planning scale the
  head's saved logits (1.6 GB a micro-batch of four sequences) held ``P`` to ``M`` times on
  the last stage of a zero-bubble or GPipe shape is over the limit before any method runs.
- **The held counts per stage** (no recomputation). Stage ``s`` holds ``a_s c_s`` at once,
  and ``sum over s of a_s >= sum over blocks of a_b = A``; with ``X = max_s a_s c_s`` each
  ``a_s <= X / c_s``, so ``A <= X sum_s 1 / c_s``, i.e. some rank holds at least
  ``A / sum_s (1 / c_s)`` of activations: for 1F1B (``c_s = P - s``) about
  ``A / ln P`` where the mean gave ``A / P``.
"""

from __future__ import annotations

from functools import lru_cache

from ..memory import model_state
from ..planner.memory import (optimizer_state_bytes, plan_sharding, stage_activation_bytes,
                              stage_weights)
from ..planner.plan import Plan
from ..schedules import get_info
from ..sim import Costs
from .bounds import round_trips
from .held_floor import held_at_least
from .memory import ROUNDING
from .problem import AutoProblem, Candidate

__all__ = ["StateFloor", "inflight_floor"]


class StateFloor:
    """:func:`static_memory`'s floor over every split (module docstring), per problem."""

    def __init__(self, problem: AutoProblem) -> None:
        profile = problem.profile
        weights = profile.stage_parameter_bytes(0, profile.num_blocks)
        whole = Plan(num_blocks=profile.num_blocks, stages=((0, profile.num_blocks),),
                     microbatches=1)
        state = 0.0 if profile.ties else sum(
            optimizer_state_bytes(profile, whole, problem.optimizer))
        self.weights, self.state = weights, state
        self.per_copy = 2.0 * weights + state
        """``2 |W| + K``: a pipeline copy's model state, summed over its ranks."""
        self.problem = problem
        self.saved = sum(profile.stash_bytes)
        """``sum over blocks of a_b`` at the profile's micro-batch."""

    def __call__(self, candidate: Candidate) -> float:
        """Bytes some rank of ``candidate`` holds at least, on every split."""
        per_copy = self.per_copy
        if candidate.shard != "none" and candidate.width > 1:
            share = 1.0 / candidate.width
            per_copy = (1.0 + share) * self.weights + share * self.state
        return candidate.pipelines * per_copy / candidate.depth

    def peak(self, candidate: Candidate) -> float:
        """Bytes some rank of ``candidate``'s memory model holds at its peak, on every split:
        the larger of the static floor and :meth:`held`."""
        return max(self(candidate), self.held(candidate))

    def held(self, candidate: Candidate) -> float:
        """The floor of :func:`~pipeweave.auto.held_floor.held_floor` over every split
        (module docstring; 0 where it does not apply)."""
        if candidate.pipelines != 1 or not get_info(
                candidate.schedule).synchronous or (candidate.width == 1
                                                    and candidate.chunks == 1):
            return 0.0
        depth = candidate.depth
        least = _least_held(candidate.schedule, candidate.stages, depth,
                            candidate.microbatches // candidate.width)  # one copy's M
        batch = self.problem.profile.batch_size
        scale = 1.0 if batch is None else self.problem.batch // candidate.microbatches / batch
        share = 1.0 / candidate.width if candidate.shard != "none" else 1.0
        held = 0.0 if candidate.recompute else \
            least * scale * self.saved / candidate.chunks * (1.0 - ROUNDING)
        mean = (share * (self.weights + self.state) + held) / depth
        return max(mean, self._per_stage(candidate, scale) * (1.0 - ROUNDING))

    def _per_stage(self, candidate: Candidate, scale: float) -> float:
        """Activation bytes some rank holds on every split, from the model's end blocks and
        the held counts per stage (module docstring: the ends, the held counts)."""
        stages, recompute = candidate.stages, candidate.recompute
        counts = _held_counts(candidate.schedule, stages, candidate.depth,
                              candidate.microbatches // candidate.width)
        stash = self.problem.profile.stash_bytes
        floor = counts[-1] * stash[-1] if recompute < stages else 0.0
        if recompute == 0:
            floor = max(floor, counts[0] * stash[0],
                        self.saved / sum(1.0 / count for count in counts))
        return scale * floor


@lru_cache(maxsize=4096)
def _held_counts(schedule: str, stages: int, depth: int, microbatches: int) -> tuple[int, ...]:
    """Per stage of the shape: the micro-batches it surely holds (at least 1)."""
    return tuple(held_at_least(schedule, s, stages, depth, microbatches) for s in range(stages))


@lru_cache(maxsize=4096)
def _least_held(schedule: str, stages: int, depth: int, microbatches: int) -> int:
    """The fewest micro-batches any stage of the shape surely holds."""
    return min(held_at_least(schedule, s, stages, depth, microbatches) for s in range(stages))


def inflight_floor(problem: AutoProblem, plan: Plan, costs: Costs, period: float) -> list[float]:
    """Per rank of a synchronous ``plan``: bytes its memory model's peak exceeds whenever
    the plan's iteration is shorter than ``period`` seconds (the time that would beat the
    best plan so far), from the stages' costs alone, with no schedule built.

    Micro-batch ``m``'s activation on stage ``s`` stays held (the memory model counts it, by
    program order, from its forward to its backward, ``pipeweave.memory.held``) at least
    through ``[end of F(s, m), start of its gradient on s]``, which lasts at least ``down(s)``
    (:func:`~pipeweave.auto.bounds.round_trips`: its forwards on every later stage, their
    gradients and both crossings of every boundary; a Slicer half holds half an activation
    for at least that long too). A replica of ``s`` runs ``n_s = N ceil(M / replicas)`` of
    them, each ``a_s`` bytes, all inside the iteration ``[0, T]``. The bytes held on rank
    ``r`` at time ``t``, ``A_r(t)``, are at least those of the intervals open then, so::

        T * max_t A_r(t)  >=  integral of A_r over [0, T]  >=  sum over s on r of a_s n_s down(s)

    and a plan with ``T < period`` peaks above ``P_r + K_r + sum_s a_s n_s down(s) / period``
    (``P_r``, ``K_r``: the rank's parameters and optimizer state, which the memory model adds
    to the activations it holds, :func:`~pipeweave.auto.memory.memory_floor`). A candidate
    with that over the memory limit on some rank cannot both fit and beat the best: it is
    pruned without being built.
    """
    if period <= 0 or not get_info(plan.schedule).synchronous:
        return [0.0] * plan.world_size
    layout = plan.layout()
    table = costs.resolve(len(plan.stages))
    down = round_trips(layout, table, get_info(plan.schedule).split_backward)
    profile = problem.profile
    rows = problem.batch // plan.microbatches
    scale = 1.0 if profile.batch_size is None else rows / profile.batch_size
    kept = stage_activation_bytes(profile, plan, scale)
    held = [0.0] * layout.num_ranks
    for s, ranks in enumerate(layout.stage_ranks):
        runs = plan.pipelines * -(-plan.microbatches // len(ranks))
        for r in ranks:
            held[r] += kept[s] * runs * down[s] / period
    states = model_state(stage_weights(profile, plan),
                         optimizer_state_bytes(profile, plan, problem.optimizer),
                         [layout.stages_of(r) for r in range(layout.num_ranks)],
                         pipelines=plan.pipelines, reference=False,
                         sharding=plan_sharding(plan))
    return [s.parameters + s.optimizer_state + h for s, h in zip(states, held)]
