"""RankInterpreter: runs one rank's action list with torch.

This is the runtime's only reading of a schedule: it walks the rank's program in order and
does what each action says. Where an input comes from is asked of
:func:`pipeweave.ir.deps.dependencies` (a receive, or the previous stage on this same rank),
where an output goes of :func:`pipeweave.ir.deps.receiver`. Both executors — the distributed
one and the single-process one — drive this same class; only the transport differs.

:meth:`RankInterpreter.run` is a generator that yields when it must wait for another rank
(single-process executor only; the distributed transport blocks instead).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...ir import Action, Op, Schedule, dependencies, ref
from ...ir.deps import producer_rank, receiver
from .microbatches import MicrobatchSource
from .stage import StageRuntime
from ..observation.timeline import Recorder
from ..communication.transport import Transport
from .clipping import GradientClipper
from .ties import TiedGradients
from .global_check import GlobalCheck, RedoPlan, rng_state, set_rng_state, starts_validated
from .weights import StageWeights

if TYPE_CHECKING:
    from ..observation.memory import ActivationMeter
    from .parts import RankParts

__all__ = ["RankInterpreter"]

_PREFETCH = 2  # receives posted ahead of need, so transfers overlap with compute


class RankInterpreter:
    """Interprets ``schedule.programs[rank]`` (the schedule must be lowered)."""

    def __init__(
        self,
        *,
        rank: int,
        schedule: Schedule,
        parts: RankParts,
        transport: Transport,
        data: MicrobatchSource,
        recorder: Recorder | None = None,
        on_step: Callable[[Action, Mapping[int, StageRuntime]], None] | None = None,
        start: int = 0,
        after: Mapping[int, Callable[[], None]] | None = None,
        meter: ActivationMeter | None = None,
        clipper: GradientClipper | None = None,
        ties: TiedGradients | None = None,
        check: GlobalCheck | None = None,
    ) -> None:
        """``parts``: the rank's stages, optimizers, weight versions and, for AvgPipe, its
        further parallel pipelines and reference models (:func:`.parts.build_rank`);
        ``start``: position to begin at (a resumed run, :mod:`..checkpoint.recovery`);
        ``after``: ``position -> hook`` run right after that action (checkpoints, fault
        injection); ``meter``: counts the activation bytes kept between forwards and backwards
        (:mod:`..observation.memory`; the online advance controller's memory reading);
        ``clipper``: clips the global gradient norm before each iteration's first update;
        ``ties``: sums the gradients of a tied parameter's copies on several stages before
        their updates (:mod:`.ties`);
        ``check``: runs the ``C`` and ``V`` actions of a checked schedule (zb-h2's
        ``post_validation``, :mod:`.global_check`), redoing the forwards that ran on an
        update the check undid."""
        if not schedule.lowered:
            raise ValueError("RankInterpreter needs a lowered schedule (pipeweave.ir.lower)")
        self.rank = rank
        self.schedule = schedule
        self.program = schedule.programs[rank]
        self.parts = parts
        self.stages = parts.stages
        self.averagers = parts.averagers
        self.transport = transport
        self.meter = meter
        self.clipper = clipper
        self.ties = ties if ties is not None and ties.at else None
        self.check = check
        if check is not None and not starts_validated(schedule.programs[rank], start):
            raise ValueError(f"a run with a global check (post_validation) can start only where "
                             f"every earlier update is validated (a drain); position {start} "
                             f"of rank {rank}'s program is not one")
        self.data = data
        self.recorder = recorder
        self.on_step = on_step
        self.start = start
        self.after = dict(after or {})
        self.executed = start
        self._values: dict[Action, Tensor] = {}
        """Outputs of F (activations) and B (input gradients) and received tensors, by ref."""

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> Generator[None, None, None]:
        routes = self._routes()
        receives = [p for p, a in enumerate(self.program)
                    if p >= self.start and a.op in (Op.RECV_ACT, Op.RECV_GRAD)]
        after = self.after
        ties = self.ties
        texts = [str(action) for action in self.program] if self.recorder else []
        redo = RedoPlan(self.schedule, self.rank) if self.check is not None else None
        next_receive = 0
        window_moved = True
        position = self.start - 1
        while position + 1 < len(self.program):
            position += 1
            action = self.program[position]
            # Post the next receives early so transfers overlap compute. The window only moves,
            # and a receive only becomes postable (its kind's header known), at a receive.
            if window_moved:
                for upcoming in receives[next_receive:next_receive + _PREFETCH]:
                    self.transport.prefetch(*routes[upcoming])
                window_moved = False
            start = self.recorder.mark() if self.recorder else 0.0
            if ties is not None and position in ties.at:  # before the AR / U it precedes
                yield from ties.reduce(position, self._modules, self.transport)
            op = action.op
            if op is Op.FORWARD:
                self._forward(action)
            elif op is Op.BACKWARD or op is Op.BACKWARD_INPUT:
                self._backward(action, position)
            elif op is Op.BACKWARD_WEIGHT:
                self._backward_weight(action, position)
            elif op is Op.SEND_ACT or op is Op.SEND_GRAD:
                message, dst = routes[position]
                self.transport.send(message, self._values.pop(self._produced_by(action)), dst)
            elif op is Op.RECV_ACT or op is Op.RECV_GRAD:
                message, src = routes[position]
                self._values[ref(action)] = yield from self.transport.recv(message, src)
                next_receive += 1
                window_moved = True
            elif op is Op.ALL_REDUCE:
                yield from self._all_reduce(action)
            elif op is Op.STEP:
                if self.clipper is not None and position in self.clipper.at:
                    yield from self.clipper.clip(action, self.transport)
                self._step(action, position)
                if redo is not None and position in redo.restart_rng:
                    redo.restart_rng[position] = rng_state()
            elif op is Op.CHECK:
                assert self.check is not None, "a checked schedule needs its GlobalCheck"
                yield from self.check.check(action, self.transport)
            elif op is Op.VALIDATE:
                assert self.check is not None and redo is not None
                restart = yield from self._validate(action, position, redo, routes)
                if restart is not None:
                    self.executed = restart  # the next action's position (progress, for the
                    position = restart - 1   # single-process executor's deadlock watch)
                    next_receive = next((i for i, p in enumerate(receives) if p >= restart),
                                        len(receives))
                    window_moved = True
                    continue
            elif op is Op.AVERAGE:
                self._average(action)
            if self.recorder:
                self.recorder.add(texts[position], start, self.recorder.mark())
            self.executed += 1
            if position in after:
                after[position]()
        self.transport.finish()

    def _validate(self, action: Action, position: int, redo: RedoPlan,
                  routes: dict[int, tuple[Action, int]]) -> Generator[None, None, int | None]:
        """``V``: the complete state; where it undoes the update, redo the update, drop what
        the forwards since the update made, receive and drop the messages the previous stage
        sent from its own undone forwards, and return the position to run again from (the
        first action after the update). ``V`` runs once: redone, it passes."""
        check = self.check
        assert check is not None
        if position in redo.validated:
            return None
        redo.validated.add(position)
        yield from check.receive_complete(action, self.transport)
        update = redo.update_of.get(position)
        if update is None or not check.needs_redo(action):  # validated before its update
            check.pass_on(action, self.transport)
            return None
        for earlier in self.program[update + 1:position]:
            self._forget(earlier)
        for stale in redo.stale[position]:
            yield from self.transport.recv(*routes[stale])
        check.pass_on(action, self.transport)
        set_rng_state(redo.restart_rng[update])  # the forwards draw the same dropout again
        return update + 1

    def _forget(self, action: Action) -> None:
        """Drop what ``action`` (a forward or its message, about to run again) left behind."""
        self._values.pop(ref(action), None)
        if action.op is Op.FORWARD:
            assert action.microbatch is not None
            self._stages(action)[action.stage].forget((action.microbatch, action.piece,
                                                       action.pipeline))
            if self.meter is not None:
                self.meter.release(action.stage, action.microbatch, action.pipeline)

    def _routes(self) -> dict[int, tuple[Action, int]]:
        """``position -> (message, peer rank)`` for every send and receive of the program.

        Fixed by the schedule, so worked out once before the loop rather than at every
        action of every iteration.
        """
        layout = self.schedule.layout
        routes: dict[int, tuple[Action, int]] = {}
        for position, action in enumerate(self.program):
            if action.op in (Op.RECV_ACT, Op.RECV_GRAD):
                (message,) = dependencies(action, layout, lowered=True)
                routes[position] = (message, producer_rank(message, layout))
            elif action.op in (Op.SEND_ACT, Op.SEND_GRAD):
                routes[position] = (ref(action), receiver(action, layout)[1])
        return routes

    @staticmethod
    def _produced_by(send: Action) -> Action:
        producer = Op.FORWARD if send.op is Op.SEND_ACT else Op.BACKWARD
        return Action(producer, send.stage, send.microbatch, send.piece, pipeline=send.pipeline)

    def _input_of(self, action: Action) -> Tensor | None:
        """The tensor an F or B consumes from upstream (None: nothing, e.g. last-stage B)."""
        deps = dependencies(action, self.schedule.layout, lowered=True)
        if not deps:
            return None
        (dep,) = deps
        return self._values.pop(dep)

    # -- compute ------------------------------------------------------------------------
    def _forward(self, action: Action) -> None:
        stage = self._stages(action)[action.stage]
        j, piece, pipeline = action.microbatch, action.piece, action.pipeline
        assert j is not None
        if action.stage == 0:
            inputs = self.data.inputs(j, piece, pipeline)
        else:
            received = self._input_of(action)
            assert received is not None
            inputs = received
        target = self.data.targets(j, piece, pipeline) if stage.is_last else None
        weights = self._weights(action)[action.stage]
        plan = weights.forward_plan(action)
        replica = weights.forward_module(action, plan)
        if self.meter is None:
            output = stage.forward((j, piece, pipeline), inputs, target=target,
                                   batch_rows=self._batch_rows(), replica=replica,
                                   keep_graph=plan.keep_graph)
        else:
            with self.meter.forward((action.stage, j, piece, pipeline),
                                    stage.module if replica is None else replica,
                                    inputs) as kept:
                output = stage.forward((j, piece, pipeline), inputs, target=target,
                                       batch_rows=self._batch_rows(), replica=replica,
                                       keep_graph=plan.keep_graph)
                if output is not None:
                    kept.append(output)
        if output is not None:
            self._values[ref(action)] = output

    def _backward(self, action: Action, position: int) -> None:
        """``B``, or ``I`` (the input gradient, sent on by the ``SB`` that follows; ``W`` later)."""
        stage = self._stages(action)[action.stage]
        weights = self._weights(action)[action.stage]
        assert action.microbatch is not None
        grad_output = None if stage.is_last else self._input_of(action)
        run = stage.backward if action.op is Op.BACKWARD else stage.backward_input
        grad_input = run(action.microbatch, action.pipeline, grad_output,
                         batch_rows=self._batch_rows(),
                         recompute_module=lambda piece: weights.recompute_module(action, piece))
        if action.op is Op.BACKWARD:
            self._release(action, position)
        if grad_input is not None and action.stage > 0:
            self._values[ref(action)] = grad_input

    def _backward_weight(self, action: Action, position: int) -> None:
        """``W``: the weight gradients; the activations are released here, not at ``I``."""
        assert action.microbatch is not None
        self._stages(action)[action.stage].backward_weight(action.microbatch, action.pipeline)
        self._release(action, position)

    def _release(self, action: Action, position: int) -> None:
        """After a micro-batch's weight gradients: move them to the live weights, let go of
        its versions and activations."""
        assert action.microbatch is not None
        self._weights(action)[action.stage].after_backward(action, position)
        if self.meter is not None:
            self.meter.release(action.stage, action.microbatch, action.pipeline)

    def _batch_rows(self) -> int:
        return self.data.batch_rows or 1

    def _all_reduce(self, action: Action) -> Generator[None, None, None]:
        if self._stages(action)[action.stage].sharding is not None:
            return  # FSDP2 reduce-scattered the sum at the stage's last backward (.sharding)
        params = [p for p in self._stages(action)[action.stage].module.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)
        ranks = self.schedule.layout.stage_ranks[action.stage]
        total = yield from self.transport.all_reduce(action, flat, ranks)
        offset = 0
        for param in params:
            count = param.numel()
            param.grad = total.narrow(0, offset, count).view_as(param).clone()
            offset += count

    def _step(self, action: Action, position: int) -> None:
        optimizer = self._optimizers(action)[action.stage]
        weights = self._weights(action)[action.stage]
        weights.before_step(position)
        stage = self._stages(action)[action.stage]
        if self.check is None or self.check.before_step(action):
            if stage.update_scale != 1.0:
                grads = [p.grad for p in stage.module.parameters() if p.grad is not None]
                torch._foreach_mul_(grads, stage.update_scale)
            averager = self.averagers.get(action.stage)
            if averager is not None:
                averager.before_step(action.pipeline, stage.module)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        weights.after_step()
        if stage.is_last:  # losses already computed: a diverging run stops here (.losses)
            stage.loss_log.values(wait=False)
        if self.on_step is not None and action.pipeline == 0:
            self.on_step(action, self.stages)

    def _average(self, action: Action) -> None:
        averager = self.averagers.get(action.stage)
        if averager is None:
            raise RuntimeError(f"{action}: no reference model for stage {action.stage} on rank "
                               f"{self.rank}; averaging needs the parts built by build_rank")
        assert action.version is not None
        averager.average(action.pipeline, self._stages(action)[action.stage].module, action.version)

    # -- per-pipeline parts (AvgPipe's parallel pipelines; pipeline 0 is the common case) ---
    def _stages(self, action: Action) -> Mapping[int, StageRuntime]:
        return self.parts.pipeline(action.pipeline).stages

    def _modules(self, pipeline: int) -> Mapping[int, torch.nn.Module]:
        return {s: stage.module for s, stage in self.parts.pipeline(pipeline).stages.items()}

    def _optimizers(self, action: Action) -> Mapping[int, torch.optim.Optimizer]:
        return self.parts.pipeline(action.pipeline).optimizers

    def _weights(self, action: Action) -> Mapping[int, StageWeights]:
        return self.parts.pipeline(action.pipeline).weights

