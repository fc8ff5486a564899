"""Weight versions of one stage (runtime/execution/weights.py), driven action by action.

Each test hands a real program (a registered schedule's or one written in the action text
form) to :class:`StageWeights` and steps through it the way the interpreter does: F runs on
the module the plan names, B back-propagates and returns gradients to the live parameters,
U is a real ``torch.optim.SGD`` step. The weights and gradients it must produce are
computed here with plain torch on copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipeweave.ir import Action, Op, parse_action
from pipeweave.runtime.execution.stage import StagePlace, StageRuntime
from pipeweave.runtime.execution.weights import StageWeights, VersionRules
from pipeweave.schedules import Shape, build_schedule

LR = 0.1


def _module() -> nn.Module:
    torch.manual_seed(0)  # nonlinear, so that a gradient depends on the weights it is taken at
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def _x(j: int) -> Tensor:
    return torch.randn(2, 3, generator=torch.Generator().manual_seed(100 + j), dtype=torch.float64)


def _dy(j: int) -> Tensor:
    return torch.randn(2, 2, generator=torch.Generator().manual_seed(200 + j), dtype=torch.float64)


def _program(text: str) -> tuple[Action, ...]:
    return tuple(parse_action(t) for t in text.split())


def _weights(program: Sequence[Action], *, stage: int = 0, **options: object) -> StageWeights:
    module = _module()
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    return StageWeights(stage=stage, module=module, optimizer=optimizer, program=program,
                        rules=VersionRules(**options))  # type: ignore[arg-type]


def _run(weights: StageWeights, program: Sequence[Action],
         after: Callable[[int, Action], None] | None = None) -> dict[int, list[Tensor]]:
    """Step through the stage's actions as the interpreter does; returns, per micro-batch
    whose forward ran on a replica, a copy of the weights it ran on."""
    stage = StageRuntime(place=StagePlace(weights.stage, (0, 3), is_first=True),
                         blocks=weights.module, loss_fn=F.mse_loss)
    ran_on: dict[int, list[Tensor]] = {}
    for position, action in enumerate(program):
        if action.stage != weights.stage:
            continue
        j = action.microbatch
        if action.op is Op.FORWARD:
            assert j is not None
            plan = weights.forward_plan(action)
            replica = weights.forward_module(action, plan)
            stage.forward((j, action.piece, 0), _x(j), replica=replica, keep_graph=plan.keep_graph)
            if replica is not None:
                ran_on[j] = [p.detach().clone() for p in replica.parameters()]
        elif action.op is Op.BACKWARD:
            assert j is not None
            stage.backward(j, 0, _dy(j), recompute_module=lambda piece: weights.recompute_module(
                action, piece))  # called right here
            weights.after_backward(action, position)
        elif action.op is Op.STEP:
            weights.before_step(position)
            weights.optimizer.step()
            weights.optimizer.zero_grad(set_to_none=True)
            weights.after_step()
        if after is not None:
            after(position, action)
    return ran_on


def _live(weights: StageWeights) -> list[Tensor]:
    return [p.detach().clone() for p in weights.module.parameters()]


def _grads(weights: StageWeights) -> list[Tensor]:
    return [p.grad.clone() for p in weights.module.parameters() if p.grad is not None]


def _grad_at(params: Sequence[Tensor], j: int) -> list[Tensor]:
    """Gradient of micro-batch ``j``'s backward on a fresh copy holding ``params``."""
    module = _module()
    with torch.no_grad():
        for mine, value in zip(module.parameters(), params):
            mine.copy_(value)
    module(_x(j)).backward(_dy(j))
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None for g in grads)
    return grads  # type: ignore[return-value]


def _sgd(params: Sequence[Tensor], grads: Sequence[Tensor], scale: float = 1.0) -> list[Tensor]:
    return [p - LR * scale * g for p, g in zip(params, grads)]


def _plans(weights: StageWeights) -> dict[int, tuple[str, int, int, bool]]:
    return {j: (plan.mode, plan.version, plan.lookahead, plan.keep_graph)
            for (j, _), plan in sorted(weights.plans.items())}


PIPEDREAM = build_schedule("pipedream", Shape(stages=2, microbatches=2, iterations=2))


def test_the_plan_of_every_forward_follows_the_version_tags() -> None:
    rank0 = PIPEDREAM.programs[0]
    assert " ".join(map(str, rank0)) == ("0F0@0 0F1@0 0B0@0 0U@1 0F2@1 0B1@0 0U@2 0F3@2 0B2@1 "
                                         "0U@3 0B3@2 0U@4")
    # F0's backward comes before any update: live; every later one is stashed at its version
    assert _plans(_weights(rank0)) == {0: ("live", 0, 0, True), 1: ("snapshot", 0, 0, True),
                                       2: ("snapshot", 1, 0, True), 3: ("snapshot", 2, 0, True)}
    assert _plans(_weights(PIPEDREAM.programs[1], stage=1)) == {
        j: ("live", j, 0, True) for j in range(4)}
    assert {p[3] for p in _plans(_weights(rank0, recompute=True)).values()} == {False}
    # vertical sync: stage 1 runs F1 at version 0 after its update to 1, from a snapshot
    synced = build_schedule("pipedream", Shape(stages=2, microbatches=2, iterations=2,
                                               options={"vertical_sync": True}))
    assert _plans(_weights(synced.programs[1], stage=1))[1] == ("snapshot", 0, 0, True)
    # PipeOptim: the look-ahead on the action text makes a predicted forward (no graph kept)
    optim = build_schedule("pipeoptim", Shape(stages=2, microbatches=2, iterations=2))
    assert str(optim.programs[0][1]) == "0F1@0~1"
    assert _plans(_weights(optim.programs[0]))[1] == ("predicted", 0, 1, False)
    assert {p[0] for p in _plans(_weights(optim.programs[1], stage=1)).values()} == {"live"}


def test_a_snapshot_keeps_the_pre_update_weights_while_the_live_module_moves_on() -> None:
    program = PIPEDREAM.programs[0]  # 0F0 0F1 0B0 0U@1 0F2@1 0B1@0 ...
    weights = _weights(program)
    initial = _live(weights)
    checked: list[int] = []

    def check(position: int, action: Action) -> None:
        if str(action) == "0U@1":
            stashed = [p.detach() for p in weights.snapshots[0].module.parameters()]
            assert all(torch.equal(s, w) for s, w in zip(stashed, initial))
            assert not any(torch.equal(p, w) for p, w in zip(_live(weights), initial))
            checked.append(position)
        elif str(action) == "0B1@0":
            # the gradient reached the live parameters, taken at version 0, not the live one
            expected = _grad_at(initial, 1)
            assert all(torch.equal(g, e) for g, e in zip(_grads(weights), expected))
            assert not torch.allclose(_grads(weights)[0], _grad_at(_live(weights), 1)[0])
            assert 0 not in weights.snapshots  # its last user ran: back to the pool
            checked.append(position)

    ran_on = _run(weights, program, check)
    assert checked == [3, 5]
    assert all(torch.equal(r, w) for r, w in zip(ran_on[1], initial))


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_replicas_return_to_the_pool_and_versions_stay_within_n_minus_k_plus_1(stage: int) -> None:
    held: list[int] = []
    allocations = []
    for iterations in (2, 4):
        schedule = build_schedule("pipedream", Shape(stages=3, microbatches=4,
                                                     iterations=iterations))
        weights = _weights(schedule.programs[stage], stage=stage)
        _run(weights, schedule.programs[stage],
             lambda _, __: held.append(weights.replicas.held))
        # DESIGN.md: PipeDream keeps at most n - k + 1 versions (k from 1): 3, 2, 1
        assert weights.peak_versions == 3 - stage
        assert weights.snapshots == {} and weights.replicas.held == 0
        assert weights.peak_copies == max(held) == weights.replicas.allocations
        allocations.append(weights.replicas.allocations)
    assert allocations[0] == allocations[1]  # later iterations reuse the pool's replicas
    assert allocations[0] == (0 if stage == 2 else 3 - stage)


def test_a_predicted_forward_runs_on_w_minus_lr_s_grad_and_its_backward_on_w() -> None:
    program = _program("0F0@0 0B0@0 0U@1 0F1@1~2 0B1@1 0U@2")
    weights = _weights(program)
    initial = _live(weights)
    grad0 = _grad_at(initial, 0)
    w1 = _sgd(initial, grad0)
    seen: dict[str, list[Tensor]] = {}

    def keep(_: int, action: Action) -> None:
        if str(action) in ("0F1@1~2", "0B1@1"):
            seen[str(action)] = _live(weights)
            seen[f"grad {action}"] = _grads(weights)

    ran_on = _run(weights, program, keep)
    assert weights.plans[(1, 0)].mode == "predicted" and weights.plans[(1, 0)].lookahead == 2
    for got, expected in zip(ran_on[1], _sgd(w1, grad0, scale=2)):  # PipeOptim Eq. 5, s = 2
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    for live, expected in zip(seen["0F1@1~2"], w1):  # the live weights were not touched
        torch.testing.assert_close(live, expected, rtol=0, atol=1e-15)
    # the backward recomputed at the current weights W1, not at the prediction
    for got, expected in zip(seen["grad 0B1@1"], _grad_at(seen["0F1@1~2"], 1)):
        assert torch.equal(got, expected)
    assert weights.peak_versions == 2 and weights.peak_copies == 1  # live + one transient


def test_graph_mode_keeps_one_prediction_per_microbatch_in_flight() -> None:
    program = _program("0F0@0 0B0@0 0U@1 0F1@1~1 0F2@1~1 0B1@1 0B2@1 0U@2")
    weights = _weights(program, backward="graph")
    initial = _live(weights)
    grad0 = _grad_at(initial, 0)
    predicted = _sgd(_sgd(initial, grad0), grad0)
    in_flight: dict[str, tuple[int, int]] = {}
    grads: list[Tensor] = []

    def watch(_: int, action: Action) -> None:
        in_flight[str(action)] = (len(weights.predicted), weights.replicas.held)
        if str(action) == "0B1@1":
            grads.extend(_grads(weights))

    _run(weights, program, watch)
    assert weights.plans[(1, 0)].keep_graph and weights.plans[(1, 0)].keep_weights
    assert in_flight["0F2@1~1"] == (2, 2) and in_flight["0B1@1"] == (1, 1)
    assert in_flight["0B2@1"] == (0, 0) and weights.replicas.allocations == 2
    assert weights.peak_copies == 2 and weights.peak_versions == 3
    # the backward differentiated the graph built on the predicted weights
    for got, expected in zip(grads, _grad_at(predicted, 1)):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    assert not torch.allclose(grads[0], _grad_at(_sgd(initial, grad0), 1)[0])
