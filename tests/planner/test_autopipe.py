"""AutoPipe's search on a GPT at sub-layer granularity, eq. (1), and the Slicer through the planner."""

from __future__ import annotations

import pytest

from pipeweave.planner import Evaluator, PlanRequest, autopipe_search, cooldown_violation, make_plan
from pipeweave.planner.methods import straight_network
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate
from planner_fixtures import gpt_profile


def test_cooldown_rule_of_equation_1() -> None:
    # loads f+b = 3 x (1, 2, 1.5, 0.5) with B = 2F; master stage 1 has b_1 = 4
    loads, backward = [3, 6, 4.5, 1.5], [2, 4, 3, 1]
    assert cooldown_violation(loads, backward, 1) == 2  # 4.5 > 1 x 4
    assert cooldown_violation([3, 6, 1.5, 4.5], backward, 1) is None  # 1.5 <= 4, 6 <= 8
    assert cooldown_violation(loads, backward, 3) is None


def test_moving_the_master_stage_forward_shortens_the_iteration() -> None:
    # the module docstring's table (Fig. 7): same loads, different places
    schedule = build_schedule("1f1b", stages=4, microbatches=4)
    times = {}
    for loads in [(1, 1, 2, 1), (1, 2, 1, 1), (1, 2, 1.5, 0.5), (1, 2, 0.5, 1.5)]:
        result = simulate(schedule, Costs(forward=list(loads), backward=[2 * x for x in loads]))
        times[loads] = (result.master_stage, result.iteration_time)
    assert times == {(1, 1, 2, 1): (2, 31.0), (1, 2, 1, 1): (1, 29.0),
                     (1, 2, 1.5, 0.5): (1, 30.0), (1, 2, 0.5, 1.5): (1, 29.0)}


@pytest.mark.parametrize(("layers", "stages", "microbatches"), [(24, 4, 8), (24, 8, 16), (12, 4, 8),
                                                                 (4, 4, 8), (16, 6, 12)])
def test_never_slower_than_algorithm_1(layers: int, stages: int, microbatches: int) -> None:
    profile = gpt_profile(layers)
    result = make_plan(PlanRequest(profile, stages, microbatches=microbatches), "autopipe")
    start = result.details["algorithm1_iteration_time"]
    assert result.predicted_iteration_time <= start * (1 + 1e-12)
    assert result.details["simulations"] >= 1 and result.planning_seconds > 0
    # Algorithm 1 minimises the heaviest stage, so its balance is the best one possible: the
    # search trades at most a little of it for a shorter simulated iteration
    assert result.details["algorithm1_balance"] <= result.balance + 1e-12
    assert result.balance <= result.details["algorithm1_balance"] + 0.03
    if layers == 24 and stages in (4, 8):  # blocks small enough to balance: max/mean <= 1.05
        assert result.balance <= 1.05
    print(f"\nGPT {layers} layers on {stages} stages: autopipe {result.predicted_iteration_time:.5f} s "
          f"(balance {result.balance:.4f}) vs Algorithm 1 {start:.5f} s "
          f"(balance {result.details['algorithm1_balance']:.4f}); "
          f"planning {result.planning_seconds:.4f} s, {result.details['simulations']} simulations")


def test_search_improves_on_algorithm_1_for_gpt() -> None:
    profile = gpt_profile(24)
    request = PlanRequest(profile, 8, microbatches=16)
    evaluator = Evaluator(profile, "1f1b", 8, 16, straight_network(request))
    search = autopipe_search(evaluator, profile.forward, profile.backward, 8)
    assert search.result.iteration_time < search.start_result.iteration_time
    assert search.simulations == evaluator.calls == len(search.trace)
    assert search.trace[0].step == "algorithm1"
    # the start is Algorithm 1's partition, whose heaviest stage is optimal
    loads = [sum(profile.compute[a:e]) for a, e in search.start]
    assert max(loads) <= max(sum(profile.compute[a:e]) for a, e in search.bounds) + 1e-15


def equal_blocks(count: int) -> Profile:
    return Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, 0.0, 1.0, 1.0) for i in range(count)))


@pytest.mark.parametrize("stages", [2, 4, 6, 8])
def test_slicer_halves_the_startup_overhead(stages: int) -> None:
    # equal stages F=1, B=2, free links: 1F1B's startup overhead is (P-1) F, the Slicer
    # (autopipe.txt §III-C, Fig. 8) halves it, and the whole iteration gets that much shorter.
    # On 2 stages that is F/2 of an iteration of (M+1)(F+B): a few per cent, not nothing,
    # because the simulator's sends are asynchronous (the extra half-transfer costs no time).
    request = PlanRequest(equal_blocks(stages), stages, microbatches=2 * stages, slicer=True)
    result = make_plan(request, "uniform")
    saved = result.details["iteration_time_without_slicer"] - result.predicted_iteration_time
    assert result.plan.schedule == "sliced-1f1b" and result.details["sliced"] >= 1
    assert result.plan.schedule_options == {"sliced": result.details["sliced"]}
    assert saved == pytest.approx((stages - 1) * 1.0 / 2)


def test_slicer_on_a_gpt_partition() -> None:
    profile = gpt_profile(24)
    result = make_plan(PlanRequest(profile, 8, microbatches=16, slicer=True), "autopipe")
    saved = result.details["iteration_time_without_slicer"] - result.predicted_iteration_time
    forward = [sum(profile.forward[a:e]) for a, e in result.plan.stages]
    startup = sum(forward[:-1])  # (P-1) F on the way to the last stage (links nearly free)
    assert 0.75 * startup / 2 <= saved <= startup


def test_the_evaluators_path_is_its_full_simulations() -> None:
    """AutoPipe runs on ``Evaluator.path`` (iteration time and master stage alone): the same
    numbers as the full simulation, so the same search."""
    profile = gpt_profile(24)
    request = PlanRequest(profile, 8, microbatches=16)
    evaluator = Evaluator(profile, "1f1b", 8, 16, straight_network(request))
    by_path = autopipe_search(evaluator.path, profile.forward, profile.backward, 8)
    full = autopipe_search(evaluator, profile.forward, profile.backward, 8)
    assert by_path.bounds == full.bounds and by_path.trace == full.trace
    assert by_path.result.iteration_time == full.result.iteration_time
