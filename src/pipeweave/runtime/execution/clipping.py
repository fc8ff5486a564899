"""Global gradient-norm clipping across the stages of a pipeline (``--clip-grad-norm``).

What ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` does for a model in one
process, done for a model whose stages live on several ranks: the 2-norm of *all* the model's
gradients, then every gradient multiplied by ``min(1, max_norm / (norm + 1e-6))`` before the
update (torch's coefficient, its epsilon and its clamp).

Where: a synchronous schedule ends every iteration with its updates, after every weight
gradient (and replica all-reduce) of the iteration on that rank — :func:`check_clippable`
proves that for the schedule before anything runs. At a rank's first update of an iteration,
each rank adds the squares of the gradients of the stages it holds (a replicated stage is
counted on its first replica only; after the all-reduce every replica holds the same sum),
the ranks sum those numbers (one float64 all-reduce over all ranks, summed in rank order in
both executors), and every rank scales its own gradients.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...ir import WEIGHT_GRADIENT_OPS, Action, Op, Schedule
from ..communication.transport import Transport
from .features import RankFeature
from .stage import StageRuntime

if TYPE_CHECKING:
    from .interpreter import RankInterpreter

__all__ = ["GradientClipper", "check_clippable", "squares", "EPSILON"]

EPSILON = 1e-6
"""Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does."""


def check_clippable(schedule: Schedule, max_norm: float) -> None:
    """ValueError naming the fix unless every rank's updates of an iteration come after all of
    its gradients of that iteration (and ``max_norm`` is a positive number)."""
    if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip_grad_norm={max_norm!r} must be a finite number > 0 (the largest "
                         f"global gradient norm an update may apply), e.g. --clip-grad-norm 1.0")
    if not schedule.synchronous:
        raise ValueError(
            f"--clip-grad-norm needs the whole iteration's gradients before any update, and "
            f"{schedule.name!r} is asynchronous (stages update at different times on different "
            f"gradients); use a synchronous schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, ...) "
            f"or drop --clip-grad-norm")
    if schedule.pipelines != 1:
        raise ValueError(f"--clip-grad-norm with {schedule.pipelines} parallel pipelines "
                         f"(AvgPipe) is not supported: each pipeline would need its own norm; "
                         f"use --pipelines 1 or drop --clip-grad-norm")
    for rank, program in enumerate(schedule.programs):
        first_update: dict[int, int] = {}
        for position, action in enumerate(program):
            if action.op is Op.STEP and action.version is not None:
                first_update.setdefault(action.version, position)
        for position, action in enumerate(program):
            if action.op in WEIGHT_GRADIENT_OPS and action.microbatch is not None:
                update = first_update.get(action.microbatch // schedule.microbatches + 1)
                if update is not None and position > update:
                    raise ValueError(
                        f"schedule {schedule.name!r} runs {action} on rank {rank} after that "
                        f"rank's first update of its iteration ({program[update]}); "
                        f"--clip-grad-norm needs every gradient of the iteration first. Use "
                        f"another schedule or drop --clip-grad-norm")


def squares(grads: Sequence[Tensor], device: torch.device) -> Tensor:
    """``[sum of every gradient's squares]``, float64, on the rank's ``device`` (where its
    all-reduce or message goes from): one order of summation, which the clipper and the
    global check (:mod:`.global_check`) share so their norms agree bit for bit."""
    total = torch.zeros(1, dtype=torch.float64, device=device)
    if grads:
        total += torch.stack([g.double().pow(2).sum() for g in grads]).sum()
    return total


class GradientClipper(RankFeature):
    """One rank's share of the clipping (module docstring); a rank feature that clips before
    the rank's first update of each iteration."""

    def __init__(self, *, rank: int, schedule: Schedule, max_norm: float,
                 stages: Mapping[int, StageRuntime], duplicates: Sequence[Tensor] = (),
                 device: torch.device = torch.device("cpu")) -> None:
        """``duplicates``: copies of a tied parameter besides its first use's
        (:meth:`.ties.TiedGradients.duplicates`), left out of the norm: the shared weight's
        gradient counts once, as in
        the model where it is one parameter. ``device``: the rank's."""
        self.rank = rank
        self.device = device
        self._duplicates = {id(p) for p in duplicates}
        self.max_norm = max_norm
        self.stages = stages
        self.ranks = tuple(range(schedule.num_ranks))
        self.key_stage = schedule.num_stages
        """The all-reduce's key names no real stage, so it meets no replica all-reduce."""
        self.counted = [s for s in stages if schedule.layout.stage_ranks[s][0] == rank]
        """Stages whose gradients this rank adds to the norm (first replicas)."""
        program = schedule.programs[rank]
        seen: set[int] = set()
        self.at: set[int] = set()
        """Positions of the rank's first update of each iteration."""
        for position, action in enumerate(program):
            if action.op is Op.STEP and action.version not in seen:
                seen.add(action.version)  # type: ignore[arg-type]
                self.at.add(position)
        self.norms: list[float] = []
        """The global gradient norm before clipping, per iteration."""

    def before(self, interpreter: RankInterpreter, position: int,
               action: Action) -> Generator[None, None, None] | None:
        if position in self.at:  # positions of updates only
            return self.clip(action, interpreter.transport)
        return None

    def clip(self, action: Action, transport: Transport) -> Generator[None, None, None]:
        """Sum the squares with every rank, then scale this rank's gradients."""
        own = torch.zeros(1, dtype=torch.float64, device=self.device)
        for stage in self.counted:  # + 0 + s is s, bit for bit: one sum per stage as before
            own += squares(self._grads(stage, counted=True), self.device)
        total = own
        if len(self.ranks) > 1:
            key = Action(Op.ALL_REDUCE, self.key_stage, version=action.version)
            total = yield from transport.all_reduce(key, own, self.ranks)
        norm = math.sqrt(float(total.item()))
        self.norms.append(norm)
        coefficient = min(1.0, self.max_norm / (norm + EPSILON))
        for stage in self.stages:
            grads = self._grads(stage)
            if grads:
                torch._foreach_mul_(grads, coefficient)

    def _grads(self, stage: int, *, counted: bool = False) -> list[Tensor]:
        """The stage's gradients (``counted``: those the norm adds up)."""
        return [p.grad for p in self.stages[stage].module.parameters() if p.grad is not None
                and not (counted and id(p) in self._duplicates)]
