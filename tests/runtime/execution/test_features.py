"""Rank features (runtime/execution/features.py): a feature defined only here joins a run
through the public path (``run_local(features=...)``) without touching the interpreter, sees
what it should, and changes no number; the interpreter refuses an op nobody runs or two
features claiming one; no constructor of the rank's machinery grows past six arguments."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import torch

from pipeweave.ir import Action, Op, Schedule
from pipeweave.runtime import run_local
from pipeweave.runtime.communication.transport import LocalTransport
from pipeweave.runtime.execution.features import Handler, RankFeature
from pipeweave.runtime.execution.interpreter import RankInterpreter, RankIO
from pipeweave.runtime.execution.microbatches import MicrobatchSource
from pipeweave.runtime.execution.parts import PipelineParts, RankParts, make_schedule
from pipeweave.runtime.launch.assemble import AssembledRank, RankFeatures
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.runtime.observation.results import merged_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runtime_jobs import mlp_job  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class CountForwards(RankFeature):
    """Counts the forwards each stage runs, and where every update ran (position, stage,
    version), through the before and after hooks only."""

    def __init__(self, seen: dict[str, object]) -> None:
        self.forwards: dict[int, int] = {}
        self.steps: list[tuple[int, int, int | None]] = []
        self.executed_after_step: list[int] = []
        seen.setdefault("features", []).append(self)  # type: ignore[union-attr]

    def before(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is Op.FORWARD:
            self.forwards[action.stage] = self.forwards.get(action.stage, 0) + 1

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is Op.STEP:
            self.steps.append((position, action.stage, action.version))
            self.executed_after_step.append(interpreter.executed)


def test_a_new_feature_joins_a_run_sees_every_forward_and_update_and_changes_nothing() -> None:
    job = mlp_job(depth=2, steps=3, microbatches=4)
    schedule = prepare(job).schedule
    seen: dict[str, object] = {}
    by_rank: dict[int, CountForwards] = {}

    def factory(rank: int, program: Schedule) -> list[RankFeature]:
        assert program is schedule or program.programs == schedule.programs
        by_rank[rank] = CountForwards(seen)
        return [by_rank[rank]]

    with_feature = run_local(job, features=factory)
    plain = run_local(job)
    assert sorted(by_rank) == [0, 1]
    for rank, feature in by_rank.items():
        program = schedule.programs[rank]
        (stage,) = schedule.layout.stages_of(rank)
        assert feature.forwards == {stage: job.steps * job.plan.microbatches}
        updates = [(p, a.stage, a.version) for p, a in enumerate(program) if a.op is Op.STEP]
        assert feature.steps == updates and len(updates) == job.steps
        assert feature.executed_after_step == [p + 1 for p, _, _ in updates]
    # the feature only watched: the same losses and weights, bit for bit
    assert [r.losses for r in with_feature] == [r.losses for r in plain]
    got, want = merged_parameters(with_feature), merged_parameters(plain)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


class StealStep(RankFeature):
    def attach(self, interpreter: RankInterpreter) -> dict[Op, Handler]:
        return {Op.STEP: lambda action, position: None}


def _bare_interpreter(schedule: Schedule, *features: RankFeature) -> RankInterpreter:
    io = RankIO(MicrobatchSource([], microbatches=schedule.microbatches),
                LocalTransport().endpoint(0))
    return RankInterpreter(rank=0, schedule=schedule, parts=RankParts((PipelineParts({}, {}, {}),)),
                           io=io,
                           features=features)


def test_an_op_is_run_by_one_handler_and_every_op_has_one() -> None:
    plain = make_schedule(mlp_job(depth=1).plan, steps=1)
    with pytest.raises(ValueError, match=r"StealStep runs \['U'\], which already have a handler"):
        _bare_interpreter(plain, StealStep())
    checked = make_schedule(dataclasses.replace(
        mlp_job(depth=2, schedule="zb-h2").plan,
        schedule_options={"post_validation": True}), steps=1)
    assert any(a.op is Op.CHECK for a in checked.programs[0])
    with pytest.raises(ValueError, match=r"no feature runs them.*GlobalCheck"):
        _bare_interpreter(checked)


def test_no_constructor_of_a_rank_takes_more_than_six_arguments() -> None:
    """Issue 27 item 4: a feature plugs in; it does not add an argument (it was 13)."""
    from pipeweave.runtime.execution.stage import StageRuntime
    from pipeweave.runtime.execution.weights import StageWeights

    for machinery in (RankInterpreter, StageRuntime, StageWeights):
        parameters = inspect.signature(machinery.__init__).parameters
        assert len([p for p in parameters if p != "self"]) <= 6, (machinery, list(parameters))
    for record in (AssembledRank, RankFeatures, RankIO):
        assert dataclasses.is_dataclass(record) and len(dataclasses.fields(record)) <= 6
    assert AssembledRank.__dataclass_params__.frozen  # type: ignore[attr-defined]
