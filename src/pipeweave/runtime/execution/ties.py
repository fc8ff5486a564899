"""Tied parameters across stages: one logical parameter, a copy on every holding stage.

A parameter several blocks share (``ModelSpec.tied``: GPT-2's ``wte`` and ``lm_head``) stays
one ``Parameter`` inside one stage. When the plan puts its blocks on different stages, each
holding stage gets its own copy (the stage deep-copies its blocks), and the copies are kept
one logical parameter the way Megatron-LM keeps its word embeddings: after the last weight
gradient of an update period and before any update, the holders sum their copies' gradients,
so every copy gets the gradient of the whole loss with respect to the shared weight (the sum
of both uses'), every holder's optimizer applies the same step to the same value, and the
copies stay identical (checkpoints verify that and store the weight once, under its first
use's name)::

    rank 0  ... 0B3 | Σ ─ 0U        Σ: copy gradients summed among the holders,
    rank 1  ... 1B3 | Σ ─ 1U           one all-reduce over a gloo group of their ranks

**Where.** On each holding rank, at its first ``AR`` or ``U`` of the update (before the
replica all-reduce and before gradient clipping): with data-parallel replicas, replica ``i`` of
each holding stage sums with replica ``i`` of the others, then the replica all-reduce adds the
replicas up, so every copy ends with ``sum over replicas and uses`` exactly. Two holders on one
rank (V-shaped placements) add locally first.

**When it is exact** (:func:`split_ties` checks it from the schedule before anything runs): the
two copies must see the same weights. That holds when every micro-batch runs its forward and
backward at the same weight version on every holding stage, nothing is predicted (no
``lookahead``), and the holders' n-th updates consume the same micro-batches: every
synchronous schedule (gpipe, 1f1b, interleaved, zero-bubble: the sum comes after the last
``W``), AvgPipe (per parallel pipeline) and PipeDream-2BW (every stage runs batch ``b`` at
version ``b - 1``). PipeDream's stashing and WPipe's first group put different versions on
different stages, PipeOptim and SpecTrain predict: those are refused, naming the fix. The
rules live in :mod:`pipeweave.ir.ties` (no torch), where ``pipeweave auto`` asks them too.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ...ir import Action, Schedule
from ...ir.layout import Layout
from ...ir.ties import gradient_after_its_sum, tie_refusal, update_sum_positions
from ...models import ModelSpec
from ...planner.plan import Plan
from .features import RankFeature

if TYPE_CHECKING:
    from .interpreter import RankInterpreter

__all__ = ["SplitTie", "split_ties", "tie_groups", "TiedGradients"]


class AllReducing(Protocol):
    """What :meth:`TiedGradients.reduce` needs of a transport."""

    def all_reduce(self, key: Hashable, flat: Tensor,
                   ranks: Sequence[int]) -> Generator[None, None, Tensor]: ...


@dataclass(frozen=True)
class SplitTie:
    """One shared parameter whose blocks sit on several stages."""

    names: tuple[str, ...]
    """Global names of its uses, block order; ``names[0]`` is what checkpoints store."""
    stages: tuple[int, ...]
    """The holding stages, ascending."""
    local: tuple[str, ...]
    """Per holding stage, the copy's name inside that stage's module (its first use there)."""

    def ranks(self, layout: Layout, replica: int) -> tuple[int, ...]:
        """The ranks holding replica ``replica`` of each holding stage (who sum together)."""
        return tuple(sorted({layout.stage_ranks[s][replica] for s in self.stages}))


def split_ties(spec: ModelSpec, plan: Plan, schedule: Schedule) -> tuple[SplitTie, ...]:
    """The ties of ``spec`` that ``plan`` splits over stages; ValueError naming the schedule and
    the fix when ``schedule`` cannot keep such a tie exact (module docstring)."""
    stage_of = {block: stage for stage, (start, end) in enumerate(plan.stages)
                for block in range(start, end)}
    found = []
    for names in spec.tied:
        first_per_stage: dict[int, str] = {}
        for name in names:
            block, _, rest = name.partition(".")
            stage = stage_of[int(block)]
            start = plan.stages[stage][0]
            first_per_stage.setdefault(stage, f"{int(block) - start}.{rest}")
        if len(first_per_stage) > 1:
            stages = tuple(sorted(first_per_stage))
            tie = SplitTie(tuple(names), stages, tuple(first_per_stage[s] for s in stages))
            _check_exact(spec, tie, schedule)
            found.append(tie)
    return tuple(found)


def tie_groups(ties: Sequence[SplitTie], layout: Layout) -> list[tuple[int, ...]]:
    """Every process group the ties sum over (each rank must create the same list)."""
    groups = []
    for tie in ties:
        for replica in range(layout.replicas(tie.stages[0])):
            ranks = tie.ranks(layout, replica)
            if len(ranks) > 1 and ranks not in groups:
                groups.append(ranks)
    return groups


def _check_exact(spec: ModelSpec, tie: SplitTie, schedule: Schedule) -> None:
    """The rules are :func:`pipeweave.ir.ties.tie_refusal`'s (``pipeweave auto`` asks them
    too); this names the model, the blocks and the fix."""
    reason = tie_refusal(tie.stages, schedule)
    if reason is None:
        return
    blocks = ", ".join(f"{int(n.partition('.')[0])} ({spec.block_names[int(n.partition('.')[0])]})"
                       for n in tie.names)
    raise ValueError(
        f"model {spec.name!r} ties {' and '.join(tie.names)} (one parameter, e.g. tied word "
        f"embeddings) and the plan puts its blocks {blocks} on stages "
        f"{', '.join(map(str, tie.stages))}; {reason}; or use a synchronous schedule (gpipe, "
        f"1f1b, interleaved-1f1b, zb-h1, ...) or 2bw, a plan with those blocks in one stage, or "
        f"build the model untied (tie_word_embeddings=False)")


class TiedGradients(RankFeature):
    """One rank's part: sums its copies' gradients with the other holders (module docstring);
    a rank feature that sums before the rank's first ``AR`` or ``U`` of each update."""

    def __init__(self, *, rank: int, schedule: Schedule, ties: Sequence[SplitTie]) -> None:
        layout = schedule.layout
        self.rank = rank
        self.local: list[tuple[int, SplitTie, list[tuple[int, str]], tuple[int, ...]]] = []
        """Per tie this rank holds: its index, the tie, the (stage, local name) of every copy
        here and the ranks it sums with."""
        for index, tie in enumerate(ties):
            here = [(s, name) for s, name in zip(tie.stages, tie.local)
                    if rank in layout.stage_ranks[s]]
            if not here:
                continue
            replica = {layout.stage_ranks[s].index(rank) for s, _ in here}
            assert len(replica) == 1, f"rank {rank} holds several replicas of {tie.names[0]}"
            self.local.append((index, tie, here, tie.ranks(layout, replica.pop())))
        self.at: dict[int, tuple[int, int]] = \
            update_sum_positions(schedule.programs[rank]) if self.local else {}
        """Position -> (update version, pipeline): the rank's first AR or U of each update."""
        holding = {s for _, _, here, _ in self.local for s, _ in here}
        late = gradient_after_its_sum(schedule.programs[rank], holding)
        if late is not None:  # a window's program (AvgPipe's online advance) is checked here
            raise ValueError(f"rank {rank} {late}; this schedule cannot keep a tie across "
                             f"stages, use another")

    def before(self, interpreter: RankInterpreter, position: int,
               action: Action) -> Generator[None, None, None] | None:
        if position in self.at:
            return self.reduce(position, interpreter.modules, interpreter.transport)
        return None

    def duplicates(self, stages: Mapping[int, torch.nn.Module]) -> list[Tensor]:
        """The copies on this rank that are not their tie's first use (a global gradient norm
        counts the shared weight once)."""
        found: list[Tensor] = []
        for _, tie, here, _ in self.local:
            for stage, name in here:
                if stage != tie.stages[0]:
                    found.append(stages[stage].get_parameter(name))
        return found

    def reduce(self, position: int, modules: Callable[[int], Mapping[int, torch.nn.Module]],
               transport: AllReducing) -> Generator[None, None, None]:
        """At ``position`` (in :attr:`at`): every local copy's gradient becomes the sum over the
        holders; ``modules(pipeline)`` gives that pipeline's stage modules."""
        version, pipeline = self.at[position]
        stages = modules(pipeline)
        for index, tie, here, ranks in self.local:
            copies = [stages[s].get_parameter(name) for s, name in here]
            total = _local_sum(copies)
            if len(ranks) > 1:
                key = ("tie", index, ranks, version, pipeline)
                flat = yield from transport.all_reduce(key, total.reshape(-1), ranks)
                total = flat.view_as(copies[0])
            for copy in copies:  # one tensor each: a stage scales its own gradients in place
                copy.grad = total.clone()


def _local_sum(copies: Sequence[Tensor]) -> Tensor:
    grads = [c.grad if c.grad is not None else torch.zeros_like(c) for c in copies]
    total = grads[0].detach().clone()
    for grad in grads[1:]:
        total += grad
    return total
