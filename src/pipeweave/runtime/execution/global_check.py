"""The global gradient check of a checked schedule (``C``, ``U``, ``V``): clipping and the NaN
check across stages, validated before or after the update (zb-h2's ``post_validation``; Qi et
al., Zero Bubble Pipeline Parallelism, ICLR 2024, §4 and appendix C).

The state of update ``v`` is two float64 numbers: the sum of the squared gradients and a
non-finite flag. ``C`` on stage ``s`` adds its own to the partial state of stages ``0..s-1``
(received from stage ``s-1``) and sends the sum to stage ``s+1``; the last stage's sum is the
complete state, which ``V`` passes back up, stage by stage (:mod:`pipeweave.ir.deps`). The
norm and coefficient are torch's: ``min(1, max_norm / (norm + 1e-6))`` (:mod:`.clipping`);
a non-finite gradient anywhere skips the update on every stage (the NaN/Inf check of mixed
precision: the iteration is dropped, the optimizer state is untouched).

At ``U``, with the complete state known (``V`` before ``U``): skip, or scale and step. With
only the partial state (``V`` after ``U``): if the partial state already clips or holds a
NaN the complete one does too, and the stage *defers* (keeps its gradients, does not step);
otherwise it steps *optimistically*, having captured its parameters, its optimizer's state
(``state_dict``, stock ``torch.optim``) and its gradients. At ``V``, when the complete state
needs nothing the step stands. Otherwise the stage restores what it captured (a deferred
stage has nothing to undo), scales the kept gradients and steps, or skips on a NaN, and tells
the interpreter to *redo* the forwards it ran since the update
(:class:`~.interpreter.RankInterpreter`), so that no result depends on the undone weights.

:class:`GlobalCheck` is a rank feature (:mod:`.features`): it runs the ``C`` and ``V`` actions,
decides at each ``U`` whether the optimizer steps, and keeps the random generators' state
after each update for the redo.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...ir import Action, Op, Schedule, dependencies, ref
from ..communication.transport import Transport
from .clipping import EPSILON, squares
from .features import Handler, RankFeature
from .stage import StageRuntime

if TYPE_CHECKING:
    from .interpreter import RankInterpreter

__all__ = ["GlobalCheck", "RedoPlan", "has_global_check", "rng_state", "set_rng_state",
           "starts_validated"]


def has_global_check(schedule: Schedule) -> bool:
    return any(a.op is Op.CHECK for program in schedule.programs for a in program)


@dataclass
class _Optimistic:
    """What a stage captured before stepping on the partial state."""

    parameters: list[Tensor]
    optimizer_state: dict[str, object]
    grads: list[Tensor | None]


class GlobalCheck(RankFeature):
    """One rank's share of the check (module docstring)."""

    def __init__(self, *, rank: int, schedule: Schedule, max_norm: float | None,
                 stages: Mapping[int, StageRuntime],
                 optimizers: Mapping[int, torch.optim.Optimizer],
                 device: torch.device = torch.device("cpu")) -> None:
        """``device``: the rank's (its check state is made there, as its messages are)."""
        self.rank = rank
        self.device = device
        self.max_norm = max_norm
        self.stages = stages
        self.optimizers = optimizers
        self.layout = schedule.layout
        self.last = schedule.num_stages - 1
        self.partial: dict[tuple[int, int], Tensor] = {}
        self.complete: dict[tuple[int, int], Tensor] = {}
        self.optimistic: dict[tuple[int, int], _Optimistic] = {}
        self.deferred: dict[tuple[int, int], list[Tensor | None]] = {}
        self.norms: list[float] = []
        """The complete global gradient norm per update (the same on every rank)."""
        self.redone: list[int] = []
        """Updates this rank redid (clipped) or skipped (non-finite) at ``V``, by version."""
        self.undone: list[int] = []
        """Of those, the ones it had made optimistically and undid first."""
        self._redo: RedoPlan | None = None
        self._interpreter: RankInterpreter | None = None

    # -- as a rank feature ----------------------------------------------------------------------
    def attach(self, interpreter: RankInterpreter) -> Mapping[Op, Handler]:
        """Run ``C`` and ``V`` for ``interpreter`` (the whole program, from its start)."""
        if not starts_validated(interpreter.program, interpreter.start):
            raise ValueError(f"a run with a global check (post_validation) can start only where "
                             f"every earlier update is validated (a drain); position "
                             f"{interpreter.start} of rank {interpreter.rank}'s program is not one")
        self._redo = RedoPlan(interpreter.schedule, interpreter.rank)
        self._interpreter = interpreter
        return {Op.CHECK: lambda action, position: self.check(action, interpreter.transport),
                Op.VALIDATE: self._validate}

    def allows_step(self, interpreter: RankInterpreter, action: Action) -> bool:
        return self.before_step(action)

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        redo = self._redo
        if action.op is Op.STEP and redo is not None and position in redo.restart_rng:
            redo.restart_rng[position] = rng_state()

    def _validate(self, action: Action, position: int) -> Generator[None, None, int | None]:
        """``V``: the complete state; where it undoes the update, redo the update, drop what
        the forwards since the update made, receive and drop the messages the previous stage
        sent from its own undone forwards, and return the position to run again from (the
        first action after the update). ``V`` runs once: redone, it passes."""
        redo, interpreter = self._redo, self._interpreter
        assert redo is not None and interpreter is not None, "attach() first"
        transport = interpreter.transport
        if position in redo.validated:
            return None
        redo.validated.add(position)
        yield from self.receive_complete(action, transport)
        update = redo.update_of.get(position)
        if update is None or not self.needs_redo(action):  # validated before its update
            self.pass_on(action, transport)
            return None
        for earlier in interpreter.program[update + 1:position]:
            interpreter.forget(earlier)
        for stale in redo.stale[position]:
            yield from transport.recv(*interpreter.routes[stale])
        self.pass_on(action, transport)
        set_rng_state(redo.restart_rng[update])  # the forwards draw the same dropout again
        return update + 1

    # -- C ------------------------------------------------------------------------------------
    def check(self, action: Action, transport: Transport) -> Generator[None, None, None]:
        s, v = action.stage, _version(action)
        state = self._local(s)
        if s > 0:
            previous = Action(Op.CHECK, s - 1, version=v)
            received = yield from transport.recv(previous, self.layout.rank_of(s - 1, 0))
            state = received + state  # summed in stage order, as the clipper's all-reduce
        if s < self.last:
            transport.send(Action(Op.CHECK, s, version=v), state, self.layout.rank_of(s + 1, 0))
        self.partial[(s, v)] = state

    def _local(self, stage: int) -> Tensor:
        own = squares(_grads(self.stages[stage]), self.device)  # as GradientClipper sums them
        flag = 0.0 if bool(torch.isfinite(own).all()) else 1.0
        return torch.cat([own, torch.tensor([flag], dtype=torch.float64, device=self.device)])

    # -- U ------------------------------------------------------------------------------------
    def before_step(self, action: Action) -> bool:
        """Prepare stage ``action.stage``'s update ``v``; False: do not step now."""
        s, v = action.stage, _version(action)
        complete = self.complete.get((s, v))
        if complete is not None:  # validated before the update
            return self._scale(s, complete)
        partial = self.partial[(s, v)]
        params = _parameters(self.stages[s])
        if _bad(partial) or self._coefficient(partial) < 1.0:
            self.deferred[(s, v)] = [_clone(p.grad) for p in params]
            return False
        self.optimistic[(s, v)] = _Optimistic(
            [p.detach().clone() for p in params],
            copy.deepcopy(self.optimizers[s].state_dict()),
            [_clone(p.grad) for p in params])
        return True

    def _scale(self, stage: int, state: Tensor) -> bool:
        if _bad(state):
            return False
        coefficient = self._coefficient(state)
        if coefficient < 1.0:
            grads = _grads(self.stages[stage])
            if grads:
                torch._foreach_mul_(grads, coefficient)
        return True

    # -- V ------------------------------------------------------------------------------------
    def receive_complete(self, action: Action,
                         transport: Transport) -> Generator[None, None, Tensor]:
        """The complete state of ``action``'s update (its own partial one on the last stage)."""
        s, v = action.stage, _version(action)
        if s == self.last:
            state = self.partial[(s, v)]
        else:
            following = Action(Op.VALIDATE, s + 1, version=v)
            state = yield from transport.recv(following, self.layout.rank_of(s + 1, 0))
        self.complete[(s, v)] = state
        if s == self.rank_first_stage():
            self.norms.append(math.sqrt(float(state[0])) if not _bad(state) else math.nan)
        return state

    def pass_on(self, action: Action, transport: Transport) -> None:
        """Send the complete state up to the previous stage."""
        s, v = action.stage, _version(action)
        if s > 0:
            transport.send(Action(Op.VALIDATE, s, version=v), self.complete[(s, v)],
                           self.layout.rank_of(s - 1, 0))

    def needs_redo(self, action: Action) -> bool:
        """After the update: whether the complete state undoes it (then it is redone here)."""
        s, v = action.stage, _version(action)
        state = self.complete[(s, v)]
        stepped = self.optimistic.pop((s, v), None)
        kept = self.deferred.pop((s, v), None)
        if not _bad(state) and self._coefficient(state) >= 1.0:
            assert stepped is not None, (s, v)  # the partial state never says more
            return False
        params = _parameters(self.stages[s])
        optimizer = self.optimizers[s]
        if stepped is not None:
            with torch.no_grad():
                for param, before in zip(params, stepped.parameters):
                    param.copy_(before)
            optimizer.load_state_dict(stepped.optimizer_state)
            kept = stepped.grads
            self.undone.append(v)
        assert kept is not None, (s, v)
        for param, grad in zip(params, kept):
            param.grad = grad
        if self._scale(s, state):
            stage = self.stages[s]
            if stage.update_scale != 1.0:
                torch._foreach_mul_(_grads(stage), stage.update_scale)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.redone.append(v)
        return True

    def rank_first_stage(self) -> int:
        return min(self.stages)

    def _coefficient(self, state: Tensor) -> float:
        if self.max_norm is None:
            return 1.0
        return min(1.0, self.max_norm / (math.sqrt(float(state[0])) + EPSILON))


def _version(action: Action) -> int:
    assert action.version is not None, action
    return action.version


def _bad(state: Tensor) -> bool:
    return bool(state[1] > 0) or not math.isfinite(float(state[0]))


def _parameters(stage: StageRuntime) -> list[torch.nn.Parameter]:
    return [p for p in stage.module.parameters() if p.requires_grad]


def _grads(stage: StageRuntime) -> list[Tensor]:
    return [p.grad for p in stage.module.parameters() if p.grad is not None]


def _clone(grad: Tensor | None) -> Tensor | None:
    return None if grad is None else grad.detach().clone()


class RedoPlan:
    """Where a ``V`` after its update sends the interpreter back to, and what it drains.

    ``update_of``: ``V``'s position -> its update's position (a ``V`` before its update is
    absent). ``stale``: ``V``'s position -> positions of this rank's later receives of
    messages that the previous stage sent between its own update and ``V``: when the check
    undoes the update, the previous stage sends them again, so the first copies are received
    and dropped before this rank lets the previous stage know (it then resends). The redo
    cannot deadlock: a drain waits only for sends the previous stage makes before its own
    ``V`` (forwards, fed by the stages before it), which wait for nothing downstream; and
    since every copy is dropped before the resend starts, the two copies of a message never
    meet in a mailbox or a tag.
    """

    def __init__(self, schedule: Schedule, rank: int) -> None:
        self.validated: set[int] = set()
        self.update_of: dict[int, int] = {}
        self.restart_rng: dict[int, tuple[Tensor, ...]] = {}
        """Update's position -> the random generators' state right after it."""
        self.stale: dict[int, list[int]] = {}
        speculative: set[Action] = set()  # messages sent between an update and its V
        for program in schedule.programs:
            for update, valid in _update_and_validation(program).items():
                speculative.update(ref(a) for a in program[update + 1:valid]
                                   if a.op is Op.SEND_ACT)
        program = schedule.programs[rank]
        for update, valid in _update_and_validation(program).items():
            self.update_of[valid] = update
            self.restart_rng[update] = ()
            version = program[valid].version
            self.stale[valid] = [
                p for p in range(valid + 1, len(program))
                if program[p].op is Op.RECV_ACT
                and dependencies(program[p], schedule.layout, lowered=True)[0] in speculative
                and (program[p].microbatch or 0) // schedule.microbatches == version]


def starts_validated(program: tuple[Action, ...], start: int) -> bool:
    """Whether no update before ``start`` waits for its ``V`` at or after it (a resumed run
    begins there with nothing to undo: zb-h2's drains, option ``drain``)."""
    return all(not update < start <= valid
               for update, valid in _update_and_validation(program).items())


def _update_and_validation(program: tuple[Action, ...]) -> dict[int, int]:
    """Position of each update -> position of its ``V`` when the ``V`` comes after it."""
    updates = {(a.stage, a.version): p for p, a in enumerate(program) if a.op is Op.STEP}
    pairs = {}
    for position, action in enumerate(program):
        if action.op is Op.VALIDATE:
            update = updates.get((action.stage, action.version))
            if update is not None and update < position:
                pairs[update] = position
    return pairs


def rng_state() -> tuple[Tensor, ...]:
    """CPU's random generator state, and the current CUDA device's when CUDA is in use."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.get_rng_state(), torch.cuda.get_rng_state()
    return (torch.get_rng_state(),)


def set_rng_state(state: tuple[Tensor, ...]) -> None:
    torch.set_rng_state(state[0])
    if len(state) > 1:
        torch.cuda.set_rng_state(state[1])
