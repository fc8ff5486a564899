"""auto.memory.static_memory computes copy 0 of a data-parallel plan and repeats it: the same
numbers, rank by rank, as the model state of every rank of the whole plan."""

from __future__ import annotations

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.memory import static_memory
from pipeweave.memory import model_state
from pipeweave.planner import Plan
from pipeweave.planner.memory import optimizer_state_bytes, stage_weights


def _every_rank(problem: AutoProblem, plan: Plan) -> list[float]:
    layout = plan.layout()
    states = model_state(stage_weights(problem.profile, plan),
                         optimizer_state_bytes(problem.profile, plan, problem.optimizer),
                         [layout.stages_of(r) for r in range(layout.num_ranks)],
                         pipelines=plan.pipelines, reference=False)
    return [s.total for s in states]


def test_copies_repeat_copy_zero() -> None:
    problem = AutoProblem(profile=small_profile(3, blocks=12), ranks=8)
    checked = 0
    for name, chunks in (("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("zbv", 2),
                         ("gpipe", 1)):
        for depth, width in ((2, 4), (4, 2), (8, 1)):
            plan = Plan.uniform(12 if chunks == 1 else depth * chunks, depth, chunks=chunks,
                                schedule=name, microbatches=2 * depth * width, width=width)
            assert static_memory(problem, plan) == _every_rank(problem, plan), (name, depth)
            checked += 1
    replicated = Plan(num_blocks=12, stages=((0, 6), (6, 12)), microbatches=8,
                      replicas=(3, 1))
    assert static_memory(problem, replicated) == _every_rank(problem, replicated)
    assert checked == 15
