"""RankInterpreter (runtime/execution/interpreter.py) driven directly, one rank at a time.

Small schedules, in-memory mailboxes (LocalTransport) and one-Linear float64 stages; every
expectation is computed here with plain torch, never with pipeweave's own code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipeweave.ir import Layout, Schedule, lower, parse_action
from pipeweave.ir.updates import update_sizes
from pipeweave.runtime.communication.transport import LocalTransport
from pipeweave.runtime.execution.features import PositionHooks, RankFeature, RecordTimeline
from pipeweave.runtime.execution.interpreter import RankInterpreter, RankIO
from pipeweave.runtime.execution.microbatches import MicrobatchSource
from pipeweave.runtime.execution.parts import PipelineParts, RankParts
from pipeweave.runtime.execution.stage import StagePlace, StageRuntime, StageTraining
from pipeweave.runtime.execution.weights import StageWeights
from pipeweave.runtime.observation.timeline import Recorder
from pipeweave.schedules import Shape, build_schedule

LR = 0.1
ROWS = 4  # rows per batch; every schedule here has 2 micro-batches of 2 rows
Batch = tuple[Tensor, Tensor]

pytestmark = pytest.mark.timeout(60)


def _blocks(count: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(3, 3).double() for _ in range(count)]


def _batches(count: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(ROWS, 3, generator=generator, dtype=torch.float64),
             torch.randn(ROWS, 3, generator=generator, dtype=torch.float64))
            for _ in range(count)]


def _interpreter(schedule: Schedule, rank: int, blocks: list[nn.Module], hub: LocalTransport,
                 batches: list[Batch], *, momentum: float = 0.0, recorder: Recorder | None = None,
                 start: int = 0,
                 after: Mapping[int, Callable[[], None]] | None = None) -> RankInterpreter:
    """One rank assembled as parts.build_rank does, with SGD and an MSE loss."""
    sizes = update_sizes(schedule)
    last = schedule.num_stages - 1
    stages: dict[int, StageRuntime] = {}
    optimizers: dict[int, torch.optim.Optimizer] = {}
    weights: dict[int, StageWeights] = {}
    for stage in schedule.layout.stages_of(rank):
        module = copy.deepcopy(blocks[stage])
        stages[stage] = StageRuntime(
            place=StagePlace(stage, (stage, stage + 1), is_first=stage == 0,
                             is_last=stage == last),
            blocks=module, loss_fn=F.mse_loss, training=StageTraining(
                loss_scale=schedule.microbatches / sizes[(last, 0)],
                update_scale=sizes[(last, 0)] / sizes[(stage, 0)]))
        optimizers[stage] = torch.optim.SGD(module.parameters(), lr=LR, momentum=momentum)
        weights[stage] = StageWeights(stage=stage, module=module, optimizer=optimizers[stage],
                                      program=schedule.programs[rank])
    features: list[RankFeature] = [RecordTimeline(recorder)] if recorder is not None else []
    if after is not None:
        features.append(PositionHooks(after))
    return RankInterpreter(rank=rank, schedule=schedule,
                           parts=RankParts((PipelineParts(stages, optimizers, weights),)),
                           io=RankIO(MicrobatchSource(batches, microbatches=schedule.microbatches),
                                     hub.endpoint(rank)),
                           features=features, start=start)


def _round_robin(*generators: Iterator[None]) -> None:
    """Resume each rank in turn until all end (what single_process._drive does)."""
    running = list(generators)
    for _ in range(1000):
        for generator in list(running):
            try:
                next(generator)
            except StopIteration:
                running.remove(generator)
        if not running:
            return
    raise AssertionError("the ranks are still waiting after 1000 rounds")


def _parameters(interpreter: RankInterpreter, stage: int = 0) -> list[Tensor]:
    return [p.detach().clone() for p in interpreter.stages[stage].module.parameters()]


def _grad(param: Tensor) -> Tensor:
    assert param.grad is not None
    return param.grad


def _microbatch(batch: Batch, index: int) -> Batch:
    x, y = batch
    return x[2 * index:2 * index + 2], y[2 * index:2 * index + 2]


def test_a_rank_waiting_for_a_message_yields_and_resumes_once_it_arrives() -> None:
    schedule = lower(build_schedule("1f1b", Shape(stages=2, microbatches=2)))
    blocks, batches, hub = _blocks(2), _batches(1), LocalTransport()
    first, second = (_interpreter(schedule, rank, blocks, hub, batches) for rank in (0, 1))
    waiting = second.run()
    for _ in range(3):
        next(waiting)  # returns control instead of blocking on 1RF0 ...
    assert second.executed == 0  # ... and does not move while nothing has been sent
    sending = first.run()
    next(sending)  # rank 0 sends both activations, then waits for its first gradient
    assert first.executed == 4 and str(first.program[4]) == "0RB0"
    with pytest.raises(StopIteration):
        next(waiting)  # every message is there now: rank 1 runs to its end without yielding
    assert second.executed == len(second.program)
    _round_robin(sending)
    assert first.executed == len(first.program)
    # what rank 1 computed its losses on is rank 0's activation, at the initial weights
    for j in (0, 1):
        x, y = _microbatch(batches[0], j)
        expected = F.mse_loss(blocks[1](blocks[0](x)), y).item() * 2 / ROWS
        assert abs(second.stages[1].losses[j] - expected) < 1e-14


def test_actions_run_in_program_order_and_start_skips_the_done_ones() -> None:
    text = "0F0 0F1 0B1 0B0 0U@1 0F2 0B2 0F3 0B3 0U@2"  # B1 before B0, on purpose
    program = tuple(parse_action(t) for t in text.split())
    schedule = lower(Schedule(name="hand", layout=Layout.straight(1), microbatches=2,
                              iterations=2, programs=(program,)))
    blocks, batches = _blocks(1), _batches(2)
    recorder = Recorder(0)
    seen: dict[int, tuple[int, list[Tensor | None]]] = {}
    interpreter: RankInterpreter

    def grads_after(position: int) -> Callable[[], None]:
        def hook() -> None:
            module = interpreter.stages[0].module
            seen[position] = (interpreter.executed,
                              [p.grad.clone() if p.grad is not None else None
                               for p in module.parameters()])
        return hook

    interpreter = _interpreter(schedule, 0, blocks, LocalTransport(), batches, recorder=recorder,
                               after={2: grads_after(2), 4: grads_after(4)})
    for _ in interpreter.run():
        raise AssertionError("a one-rank program never waits")
    assert [text for _, text, _, _ in recorder.records] == text.split()
    starts = [start for _, _, start, _ in recorder.records]
    assert starts == sorted(starts)
    assert interpreter.executed == len(program)
    # after position 2 (0B1) only micro-batch 1's gradient is in .grad; after the update none
    executed, grads = seen[2]
    assert executed == 3
    x, y = _microbatch(batches[0], 1)
    reference = copy.deepcopy(blocks[0])
    (F.mse_loss(reference(x), y) * 2 / ROWS).backward()
    for got, param in zip(grads, reference.parameters()):
        assert got is not None and torch.equal(got, _grad(param))
    assert seen[4] == (5, [None, None])
    # a resumed interpreter begins at ``start``: only the second iteration runs and is recorded
    resumed_recorder = Recorder(0)
    resumed = _interpreter(schedule, 0, blocks, LocalTransport(), batches,
                           recorder=resumed_recorder, start=5)
    for _ in resumed.run():
        pass
    assert [text for _, text, _, _ in resumed_recorder.records] == text.split()[5:]
    assert resumed.executed == len(program) and sorted(resumed.stages[0].losses) == [2, 3]


def test_losses_of_a_one_stage_schedule_match_a_hand_computation() -> None:
    schedule = lower(build_schedule("1f1b", Shape(stages=1, microbatches=2, iterations=2)))
    blocks, batches = _blocks(1), _batches(2)
    interpreter = _interpreter(schedule, 0, blocks, LocalTransport(), batches)
    for _ in interpreter.run():
        pass
    reference = copy.deepcopy(blocks[0])
    expected: dict[int, float] = {}
    for k, (x, y) in enumerate(batches):
        with torch.no_grad():
            for j in (0, 1):
                xj, yj = _microbatch((x, y), j)
                expected[2 * k + j] = F.mse_loss(reference(xj), yj).item() * 2 / ROWS
        reference.zero_grad()
        F.mse_loss(reference(x), y).backward()  # one update: the mean loss over the batch
        with torch.no_grad():
            for param in reference.parameters():
                param.sub_(LR * _grad(param))
    losses = interpreter.stages[0].losses
    assert sorted(losses) == [0, 1, 2, 3]
    for j, value in expected.items():
        assert abs(losses[j] - value) < 1e-12, (j, losses[j], value)


def test_all_reduce_and_step_equal_sgd_on_the_summed_gradient() -> None:
    # two replicas of one stage; micro-batch 0 on rank 0, micro-batch 1 on rank 1
    schedule = lower(build_schedule("1f1b", Shape(stages=1, microbatches=2, iterations=2,
                                                  width=2)))
    assert [str(a) for a in schedule.programs[0][:4]] == ["0F0@0", "0B0@0", "0AR@1", "0U@1"]
    blocks, batches, hub = _blocks(1), _batches(2), LocalTransport()
    ranks = [_interpreter(schedule, rank, blocks, hub, batches, momentum=0.9) for rank in (0, 1)]
    initial = _parameters(ranks[0])
    running = [interpreter.run() for interpreter in ranks]
    next(running[0])  # rank 0 waits in the all-reduce for rank 1's contribution
    assert ranks[0].executed == 2
    assert all(torch.equal(a, b) for a, b in zip(_parameters(ranks[0]), initial))
    _round_robin(*running)
    reference = copy.deepcopy(blocks[0])
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for batch in batches:
        grads = []
        for j in (0, 1):
            x, y = _microbatch(batch, j)
            reference.zero_grad()
            (F.mse_loss(reference(x), y) * 2 / ROWS).backward()
            grads.append([_grad(p).clone() for p in reference.parameters()])
        for param, g0, g1 in zip(reference.parameters(), *grads):
            param.grad = g0 + g1
        optimizer.step()
    for interpreter in ranks:
        for got, param in zip(_parameters(interpreter), reference.parameters()):
            assert torch.equal(got, param.detach())
