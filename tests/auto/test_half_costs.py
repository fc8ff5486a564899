"""A sliced candidate's half costs (auto/half_costs.py): the profile's block times at half the
micro-batch size, not half the whole's; other schedules get none."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from pipeweave.auto import AutoProblem
from pipeweave.auto.axes import Candidate
from pipeweave.auto.predict import candidate_costs, simulate_candidate
from pipeweave.auto.timing import plan_schedule
from pipeweave.planner import Plan
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.profiler.runtime_costs import RuntimeCosts
from pipeweave.sim import simulate

from auto_fixtures import completions

FIXED, PER_SAMPLE = 1e-3, 1e-4
"""Each block's forward: a fixed cost per call and a cost per sample (the backward twice)."""
Time = Callable[[int], float]


def _profile(size: int, time: Time = lambda m: FIXED + PER_SAMPLE * m) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", forward=time(size) * (1 + i / 4),
                                backward=2 * time(size) * (1 + i / 4),
                                output_bytes=1e3 * size, activation_bytes=1e4 * size,
                                parameter_bytes=1e4, optimizer_bytes=0.0, update=0.0)
                   for i in range(4))
    return Profile(blocks, model="toy", batch_size=size, device="synthetic",
                   source="synthetic", input_bytes=10.0 * size)


def _completed(schedule: str, time: Time = lambda m: FIXED + PER_SAMPLE * m,
               runtime: RuntimeCosts | None = None
               ) -> tuple[AutoProblem, Candidate, Plan, Profile]:
    problem = AutoProblem(profile=replace(_profile(8, time), runtime=runtime), ranks=2,
                          batch_size=16,
                          extra_profiles=(_profile(4, time),), schedules=(schedule,),
                          microbatches=(2,), methods=("uniform",), recompute=(0,), apc=(False,))
    found = [(done, plan, profile) for _, done, plan, profile in completions(problem)
             if done.width == 1 and done.pipelines == 1 and plan.depth == 2]
    assert found, f"no 2-stage {schedule} candidate"
    return problem, *found[0]


def _stage_sums(profile: Profile, bounds: tuple[tuple[int, int], ...], field: str
                ) -> list[float]:
    return [sum(getattr(b, field) for b in profile.blocks[a:e]) for a, e in bounds]


def test_a_sliced_plan_prices_its_halves_from_the_half_size_profile() -> None:
    problem, done, plan, profile = _completed("sliced-1f1b")
    table = candidate_costs(done, plan, profile, problem).resolve(len(plan.stages))
    half = _profile(4)  # micro-batches of 8 samples: halves of 4, profiled
    assert list(table.half_forward) == pytest.approx(_stage_sums(half, plan.stages, "forward"))
    assert list(table.half_backward) == pytest.approx(_stage_sums(half, plan.stages, "backward"))
    # the fixed cost makes a half dearer than half the whole: 1.4 ms of 2.8 ms, not 0.9
    assert all(h > f / 2 * 1.5 for h, f in zip(table.half_forward, table.forward))


def test_the_halves_move_the_prediction() -> None:
    problem, done, plan, profile = _completed("sliced-1f1b")
    costs = candidate_costs(done, plan, profile, problem)
    halved = replace(costs, half_forward=None, half_backward=None, half_weight_grad=None)
    schedule = plan_schedule(plan, 1, one_copy=False)
    assert simulate(schedule, costs).iteration_time > simulate(schedule, halved).iteration_time
    timed = simulate_candidate(done, profile, problem)
    assert timed.iteration_time > simulate(schedule, halved).iteration_time


def test_a_plan_that_does_not_slice_gets_no_halves() -> None:
    problem, done, plan, profile = _completed("1f1b")
    assert candidate_costs(done, plan, profile, problem).half_forward is None


def test_a_half_never_costs_less_than_half_the_whole() -> None:
    """Steeper than proportional (m^2 per call): the half-size profile says a quarter; the
    half is held at half the whole, so the search's bounds (which price a half at half the
    whole) stay bounds."""
    problem, done, plan, profile = _completed("sliced-1f1b", time=lambda m: 1e-5 * m * m)
    table = candidate_costs(done, plan, profile, problem).resolve(len(plan.stages))
    assert table.half_forward == tuple(f / 2 for f in table.forward)
    assert table.half_backward == tuple(b / 2 for b in table.backward)


def test_the_sliced_backward_pays_the_runtime_s_fixed_costs_once() -> None:
    """The runtime adds 0.5 ms to every backward action and 0.2 ms to posting a send: each
    half's forward pays them, the one backward of a sliced micro-batch (two autograd passes)
    pays them once, so ``2 half_backward`` = the half-size compute twice + the fixed once."""
    runtime = RuntimeCosts(per_action={"backward": 5e-4, "forward": 5e-4}, per_message=2e-4)
    problem, done, plan, profile = _completed("sliced-1f1b", runtime=runtime)
    table = candidate_costs(done, plan, profile, problem).resolve(len(plan.stages))
    half = _profile(4)
    posts = [False, True]  # stage 1 sends its input gradient back to stage 0
    for s, ((a, e), sends) in enumerate(zip(plan.stages, posts)):
        compute = sum(b.backward for b in half.blocks[a:e])
        fixed = 5e-4 + (2e-4 if sends else 0.0)
        assert 2 * table.half_backward[s] == pytest.approx(2 * compute + fixed)
        forward_posts = not sends
        assert table.half_forward[s] == pytest.approx(
            sum(b.forward for b in half.blocks[a:e]) + 5e-4 + (2e-4 if forward_posts else 0.0))
