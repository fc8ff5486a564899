"""A sharded stage's gathers prefetched in the schedule's own order (``Job.prefetch_gathers``).

FSDP2 (:mod:`.sharding`) gathers a block's parameters when the block's forward or backward
hook fires, and prefetches only inside one forward or backward, in module order. A pipeline
rank interleaves the actions of different micro-batches and, with interleaved and V
schedules, of different stages (chunks): which gather comes next is known only from the
rank's program, which is data. :func:`gather_plan` reads it once: for every compute action
``k'`` (``F``, ``B``, ``I``, ``W``) of a sharded stage it finds the action ``k`` before it
that is not a send or receive, and starts the gather of the block ``k'`` begins with
(``FSDPModule.unshard(async_op=True)``, :meth:`.sharding.StageSharding.prefetch`) either

- **before** ``k``, when ``k`` computes on another stage: the gather overlaps ``k``'s compute
  and the messages between (rank 0 of interleaved 1F1B, ``pp=2``: ``0F1`` then ``2F0``:
  stage 2's first block is gathered while ``0F1`` runs);
- or **after** ``k``, when ``k`` computes on the same stage (its own hooks reshard what it
  used, so earlier would be wasted) or is an update, all-reduce or check (an update changes
  the shards: a gather across it would read the old ones): the gather overlaps the sends and
  receives before ``k'`` (the wait for a peer's activation or gradient).

Which block ``k'`` begins with: a forward, the stage's first block; ``B`` or ``I``, the last
(a backward runs the blocks backwards), the first when the stage recomputes (the backward
runs the forward again first); ``W``, the last (:meth:`.sharding.StageSharding.weight_gradient`
walks the blocks backwards). FSDP2 waits for the gather in that block's own pre-forward or
pre-backward hook, or ``W``'s ``unshard``; a gather is a copy, so the training is bit for bit
the same as with FSDP2's own order (``prefetch_gathers=False``). With the same order on every
rank of a stage (the copies run the same program), the collectives stay matched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...ir import Action, Op
from .features import RankFeature

if TYPE_CHECKING:
    from .interpreter import RankInterpreter
    from .parts import RankParts

__all__ = ["Prefetch", "GatherPlan", "gather_plan", "PrefetchGathers", "prefetch_gathers"]

_COMPUTE = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
_MESSAGES = frozenset({Op.SEND_ACT, Op.SEND_GRAD, Op.RECV_ACT, Op.RECV_GRAD})


@dataclass(frozen=True)
class Prefetch:
    """Gather ``stage``'s ``first`` or ``last`` block (the one an action begins with)."""

    stage: int
    end: str


@dataclass(frozen=True)
class GatherPlan:
    """Where a rank's program starts its gathers early: ``position -> prefetch``."""

    before: Mapping[int, Prefetch]
    """Issued just before the action at ``position`` (it computes on another stage)."""
    after: Mapping[int, Prefetch]
    """Issued just after it (the same stage, or an update, all-reduce or check)."""

    def __str__(self) -> str:
        """``<3 2:first  >5 0:last``: ``<`` before, ``>`` after the action at a position."""
        marks = [(p, "<", f) for p, f in self.before.items()] + [
            (p, ">", f) for p, f in self.after.items()]
        return "  ".join(f"{m}{p} {f.stage}:{f.end}" for p, m, f in sorted(marks))


def _begins_with(action: Action, recompute: bool) -> str:
    """The block ``action`` gathers first: ``first`` or ``last`` (module docstring)."""
    if action.op is Op.FORWARD or (recompute and action.op in (Op.BACKWARD, Op.BACKWARD_INPUT)):
        return "first"
    return "last"


def gather_plan(program: Sequence[Action], sharded: Mapping[int, bool]) -> GatherPlan:
    """Where ``program`` (one rank's, lowered) starts each compute action's first gather early
    (module docstring); ``sharded``: ``stage -> recomputes?`` for the rank's sharded stages.
    A compute action with only messages before it in the program (the first) gets none."""
    before: dict[int, Prefetch] = {}
    after: dict[int, Prefetch] = {}
    previous: int | None = None  # the last action that is not a message
    for position, action in enumerate(program):
        if action.op in _MESSAGES:
            continue
        if action.op in _COMPUTE and previous is not None and action.stage in sharded:
            need = Prefetch(action.stage, _begins_with(action, sharded[action.stage]))
            earlier = program[previous]
            elsewhere = earlier.op in _COMPUTE and earlier.stage != action.stage
            (before if elsewhere else after)[previous] = need
        previous = position
    return GatherPlan(before, after)


class PrefetchGathers(RankFeature):
    """Runs a :class:`GatherPlan` around the actions (:mod:`.features`): put it after the
    features that compute around an action, so that its gathers start last before and first
    after it."""

    def __init__(self, plan: GatherPlan) -> None:
        self.plan = plan

    def _start(self, interpreter: RankInterpreter, prefetch: Prefetch | None) -> None:
        if prefetch is None:
            return
        sharding = interpreter.stages[prefetch.stage].sharding
        assert sharding is not None, "gather_plan only names sharded stages"
        sharding.prefetch(prefetch.end)

    def before(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        self._start(interpreter, self.plan.before.get(position))

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        self._start(interpreter, self.plan.after.get(position))


def prefetch_gathers(program: Sequence[Action], parts: RankParts) -> PrefetchGathers | None:
    """The feature for a rank's ``program`` and ``parts`` (None: no stage is sharded)."""
    sharded = {stage: runtime.recompute for stage, runtime in parts.stages.items()
               if runtime.sharding is not None}
    return PrefetchGathers(gather_plan(program, sharded)) if sharded else None
