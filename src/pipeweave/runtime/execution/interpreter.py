"""RankInterpreter: runs one rank's action list with torch.

This is the runtime's only reading of a schedule: it walks the rank's program in order and
does what each action says. Where an input comes from is asked of
:func:`pipeweave.ir.deps.dependencies` (a receive, or the previous stage on this same rank),
where an output goes of :func:`pipeweave.ir.deps.receiver`. Both executors — the distributed
one and the single-process one — drive this same class; only the transport differs.

Each action goes to its handler through one table (``op -> handler``); what a run adds around
the actions — clipping, tied gradients, post-validation (which runs ``C`` and ``V``), meters,
the timeline, checkpoints and other hooks at positions — are :mod:`.features` in a list, so
the interpreter does not grow an argument per feature.

:meth:`RankInterpreter.run` is a generator that yields when it must wait for another rank
(single-process executor only; the distributed transport blocks instead).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...ir import Action, Op, Schedule, dependencies, ref
from ...ir.deps import producer_rank, receiver
from ...ir.message_order import message_order
from .features import Handler, RankFeature, overriding
from .microbatches import MicrobatchSource
from .posting import OrderedPosting, WindowPosting
from .stage import StageRuntime
from ..communication.sharded import local_value, with_local
from ..communication.transport import Transport
from .weights import StageWeights

if TYPE_CHECKING:
    from .parts import RankParts

__all__ = ["RankInterpreter", "RankIO"]


@dataclass(frozen=True)
class RankIO:
    """Where a rank's inputs come from: its micro-batches (first stage's inputs, last stage's
    targets) and its messages (the transport to the other ranks)."""

    data: MicrobatchSource
    transport: Transport


class RankInterpreter:
    """Interprets ``schedule.programs[rank]`` (the schedule must be lowered)."""

    def __init__(self, *, rank: int, schedule: Schedule, parts: RankParts, io: RankIO,
                 features: Sequence[RankFeature] = (), start: int = 0) -> None:
        """``parts``: the rank's stages, optimizers, weight versions and, for AvgPipe, its
        further parallel pipelines and reference models (:func:`.parts.build_rank`);
        ``features``: what runs around the actions (:mod:`.features`: clipping, tied
        gradients, post-validation, meters, timeline, hooks), in the order their hooks run;
        ``start``: position to begin at (a resumed run, :mod:`..checkpoint.recovery`)."""
        if not schedule.lowered:
            raise ValueError("RankInterpreter needs a lowered schedule (pipeweave.ir.lower)")
        self.rank = rank
        self.schedule = schedule
        self.program = schedule.programs[rank]
        self.parts = parts
        self.stages = parts.stages
        self.averagers = parts.averagers
        self.transport = io.transport
        self.data = io.data
        self.start = start
        self.executed = start
        self._values: dict[Action, Tensor] = {}
        """Outputs of F (activations) and B (input gradients) and received tensors, by ref."""
        self.routes = self._routes()
        """``position -> (message, peer rank)`` of every send and receive."""
        self._posting = (OrderedPosting(self.program, start, self.routes, message_order(schedule))
                         if self.transport.rendezvous else WindowPosting(self.program, start))
        """Which receives to post early, and when (:mod:`.posting`)."""
        self.features = list(features)
        self._handlers = self._dispatch_table()
        self._before = overriding(self.features, "before")
        self._after = overriding(self.features, "after")
        self._gates = overriding(self.features, "allows_step")
        self._observers = overriding(self.features, "observe_forward")
        self._releasers = overriding(self.features, "released")

    def _dispatch_table(self) -> dict[Op, Handler]:
        """``op -> handler``: the interpreter's own, and those of the features that run an op
        (the global check's ``C`` and ``V``); every op of the program must have one."""
        table: dict[Op, Handler] = {
            Op.FORWARD: self._forward, Op.BACKWARD: self._backward,
            Op.BACKWARD_INPUT: self._backward, Op.BACKWARD_WEIGHT: self._backward_weight,
            Op.SEND_ACT: self._send, Op.SEND_GRAD: self._send,
            Op.RECV_ACT: self._receive, Op.RECV_GRAD: self._receive,
            Op.ALL_REDUCE: self._all_reduce, Op.STEP: self._step, Op.AVERAGE: self._average}
        for feature in self.features:
            owned = feature.attach(self)
            taken = sorted(str(op) for op in owned if op in table)
            if taken:
                raise ValueError(f"{type(feature).__name__} runs {taken}, which already have a "
                                 f"handler; give each op to one feature")
            table.update(owned)
        missing = sorted({str(a.op) for a in self.program[self.start:]} - {str(op) for op in table})
        if missing:
            raise ValueError(f"rank {self.rank}'s program has {missing} actions and no feature "
                             f"runs them; add the feature (a checked schedule's C and V: "
                             f"GlobalCheck, built by assemble_rank)")
        return table

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> Generator[None, None, None]:
        """Run the program from :attr:`start`; yields while waiting for another rank."""
        position = self.start
        while position < len(self.program):
            action = self.program[position]
            self._post(self._posting.before(position))
            for feature in self._before:
                steps = feature.before(self, position, action)
                if steps is not None:
                    yield from steps
            work = self._handlers[action.op](action, position)
            restart = (yield from work) if work is not None else None
            if restart is not None:  # post-validation undid an update: run again from there
                self._restart(restart)
                position = restart
                continue
            self.executed += 1
            self._post(self._posting.after(position))
            for feature in self._after:
                steps = feature.after(self, position, action)
                if steps is not None:
                    yield from steps
            position += 1
        self.transport.finish()

    def _post(self, receives: list[int]) -> None:
        """Post the receives at these positions early, so transfers overlap compute."""
        for upcoming in receives:
            self.transport.prefetch(*self.routes[upcoming])

    def _restart(self, position: int) -> None:
        """Continue at ``position`` (an earlier one): the next action's position (progress, for
        the single-process executor's deadlock watch) and the receive window."""
        self.executed = position
        self._posting.restart(position)

    # -- messages -----------------------------------------------------------------------
    def _send(self, action: Action, position: int) -> None:
        message, dst = self.routes[position]
        self.transport.send(message, self._values.pop(self._produced_by(action)), dst)

    def _receive(self, action: Action, position: int) -> Generator[None, None, None]:
        message, src = self.routes[position]
        self._values[ref(action)] = yield from self.transport.recv(message, src)

    def forget(self, action: Action) -> None:
        """Drop what ``action`` (a forward or its message, about to run again) left behind
        (post-validation's redo, :mod:`.global_check`)."""
        self._values.pop(ref(action), None)
        if action.op is Op.FORWARD:
            assert action.microbatch is not None
            self._stages(action)[action.stage].forget((action.microbatch, action.piece,
                                                       action.pipeline))
            for feature in self._releasers:
                feature.released(self, action)

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
    def _forward(self, action: Action, position: int) -> None:
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
        if not self._observers:
            output = stage.forward((j, piece, pipeline), inputs, target=target,
                                   batch_rows=self._batch_rows(), replica=replica,
                                   keep_graph=plan.keep_graph)
        else:  # features watching the forward (the activation meter)
            module = stage.module if replica is None else replica
            with ExitStack() as scopes:
                kept = [scopes.enter_context(scope) for scope in (
                    f.observe_forward(self, (action.stage, j, piece, pipeline), module, inputs)
                    for f in self._observers) if scope is not None]
                output = stage.forward((j, piece, pipeline), inputs, target=target,
                                       batch_rows=self._batch_rows(), replica=replica,
                                       keep_graph=plan.keep_graph)
                for outputs in kept:
                    if output is not None:
                        outputs.append(output)
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
        for feature in self._releasers:
            feature.released(self, action)

    def _batch_rows(self) -> int:
        return self.data.batch_rows or 1

    def _all_reduce(self, action: Action, position: int) -> Generator[None, None, None]:
        if self._stages(action)[action.stage].sharding is not None:
            return  # FSDP2 reduce-scattered the sum at the stage's last backward (.sharding)
        params = [p for p in self._stages(action)[action.stage].module.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        parts = [local_value(g) for g in grads]  # a tensor-parallel process sums its part
        flat = torch.cat([g.reshape(-1) for g in parts]) if parts else torch.zeros(0)
        ranks = self.schedule.layout.stage_ranks[action.stage]
        total = yield from self.transport.all_reduce(action, flat, ranks)
        offset = 0
        for param, grad, part in zip(params, grads, parts):
            count = part.numel()
            param.grad = with_local(grad, total.narrow(0, offset, count).view_as(part).clone())
            offset += count

    def _step(self, action: Action, position: int) -> None:
        optimizer = self._optimizers(action)[action.stage]
        weights = self._weights(action)[action.stage]
        weights.before_step(position)
        stage = self._stages(action)[action.stage]
        if all(feature.allows_step(self, action) for feature in self._gates):
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

    def _average(self, action: Action, position: int) -> None:
        averager = self.averagers.get(action.stage)
        if averager is None:
            raise RuntimeError(f"{action}: no reference model for stage {action.stage} on rank "
                               f"{self.rank}; averaging needs the parts built by build_rank")
        assert action.version is not None
        averager.average(action.pipeline, self._stages(action)[action.stage].module, action.version)

    # -- per-pipeline parts (AvgPipe's parallel pipelines; pipeline 0 is the common case) ---
    def _stages(self, action: Action) -> Mapping[int, StageRuntime]:
        return self.parts.pipeline(action.pipeline).stages

    def modules(self, pipeline: int) -> Mapping[int, torch.nn.Module]:
        return {s: stage.module for s, stage in self.parts.pipeline(pipeline).stages.items()}

    def _optimizers(self, action: Action) -> Mapping[int, torch.optim.Optimizer]:
        return self.parts.pipeline(action.pipeline).optimizers

    def _weights(self, action: Action) -> Mapping[int, StageWeights]:
        return self.parts.pipeline(action.pipeline).weights

