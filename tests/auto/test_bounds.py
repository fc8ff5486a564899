"""The pruning bounds never exceed the simulated iteration time (so pruning never loses the
optimum), with links and all-reduces priced, on a two-level topology, with shared cores."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates
from pipeweave.auto.bounds import plan_bound, shape_bound
from pipeweave.auto.predict import candidate_costs, predict, simulate_candidate
from pipeweave.auto.problem import Candidate
from pipeweave.auto.search import _Search, _valid_shape
from pipeweave.planner.plan import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile, Profile, TieProfile
from pipeweave.schedules import get_info
from pipeweave.sim import Costs


def _simulated(problem: AutoProblem) -> Iterator[tuple[Candidate, Plan, Profile, Costs, float]]:
    """Every valid synchronous candidate of ``problem``, partitioned and simulated: the
    candidate (before partitioning, what the shape bound sees), its plan, the profile scaled
    to its micro-batch, its costs and its simulated iteration time."""
    state = _Search(problem, lambda _text: None)
    for candidate in enumerate_candidates(problem):
        if not _valid_shape(candidate, problem) or not get_info(candidate.schedule).synchronous:
            continue
        try:
            done, plan, scaled = state.complete(candidate)
            timed = simulate_candidate(done, scaled, problem)
        except ValueError:
            continue
        yield candidate, plan, scaled, candidate_costs(done, plan, scaled, problem), \
            timed.iteration_time


@pytest.mark.parametrize("shared_cores,prefixes,tied", [
    (None, False, False), (2, False, False), (None, True, False), (None, False, True)])
def test_bounds_are_below_the_simulated_time(shared_cores: int | None, prefixes: bool,
                                             tied: bool) -> None:
    """``prefixes``: every count of leading stages recomputing, not only none and all;
    ``tied``: the first and last block share a parameter (counted once on a stage holding
    both, its gradient sum priced where they are split)."""
    profile = small_profile(7, blocks=8, link=LinkProfile(2e8, 2e-5))
    if tied:
        shared = min(profile.blocks[0].parameter_bytes, profile.blocks[7].parameter_bytes)
        profile = replace(profile, ties=(TieProfile((0, 7), shared),))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          shared_cores=shared_cores, methods=("uniform", "time", "pipedream"),
                          microbatches=(4, 8, 16), pipelines=(1, 2),
                          recompute=tuple(range(9)) if prefixes else None)
    checked = 0
    for candidate, plan, scaled, costs, time in _simulated(problem):
        assert shape_bound(candidate, scaled, problem, 1e9) <= time * (1 + 1e-9), candidate
        assert plan_bound(plan, costs, problem) <= time * (1 + 1e-9), candidate
        checked += 1
    assert checked > 100


def _heavy(profile: Profile, factor: float) -> Profile:
    """``profile`` with ``factor`` times the parameters: all-reduces and updates dominate."""
    return replace(profile, blocks=tuple(
        replace(b, parameter_bytes=b.parameter_bytes * factor, update=b.update * factor / 10)
        for b in profile.blocks))


@pytest.mark.parametrize("ranks, topology", [(8, "2x1e9,4x1e8"), (8, "4x1e9,2x5e7"),
                                             (4, "4x2e8")])
def test_bounds_hold_where_all_reduces_dominate(ranks: int, topology: str) -> None:
    """Several widths (d x w = ranks, copies across the slow level or inside the fast one),
    PipeDream's replicas, parallel pipelines, recomputation; the all-reduce of a stage is
    up to several times its compute."""
    profile = _heavy(small_profile(11, blocks=8, link=LinkProfile(2e8, 2e-5)), 60.0)
    problem = AutoProblem(profile=profile, ranks=ranks, topology=Topology.parse(topology),
                          methods=("uniform", "parameters", "pipedream"),
                          microbatches=(8, 16), pipelines=(1, 2))
    link = max(level.bandwidth for level in problem.topology.levels)  # type: ignore[union-attr]
    checked = reduce_heavy = 0
    for candidate, plan, scaled, costs, time in _simulated(problem):
        table = costs.resolve(len(plan.stages))
        assert shape_bound(candidate, scaled, problem, link) <= time * (1 + 1e-9), candidate
        assert plan_bound(plan, costs, problem) <= time * (1 + 1e-9), candidate
        reduce_heavy += max(table.all_reduce) > max(table.forward) + max(table.backward)
        checked += 1
    assert checked > 100 and reduce_heavy > 50


@pytest.mark.parametrize("topology", ["2x1e9,4x1e8", "8x2e8"])
def test_bounds_hold_for_sharded_candidates(topology: str) -> None:
    """A sharded candidate's shape bound counts its parameter gathers (every F, and every
    backward with ``full``) and stays below its simulated time; without them it would be
    the replicated candidate's bound, far below where gathers dominate."""
    profile = _heavy(small_profile(5, blocks=8, link=LinkProfile(2e8, 2e-5)), 60.0)
    problem = AutoProblem(profile=profile, ranks=8, topology=Topology.parse(topology),
                          methods=("uniform", "time"), microbatches=(8, 16),
                          shard=("full", "grad-op"))
    link = max(level.bandwidth for level in problem.topology.levels)  # type: ignore[union-attr]
    checked = raised = 0
    for candidate, plan, scaled, costs, time in _simulated(problem):
        assert candidate.shard in ("full", "grad-op") and plan.shard == candidate.shard
        bound = shape_bound(candidate, scaled, problem, link)
        assert bound <= time * (1 + 1e-9), candidate
        assert plan_bound(plan, costs, problem) <= time * (1 + 1e-9), candidate
        raised += bound > 1.5 * shape_bound(replace(candidate, shard="none"), scaled,
                                            problem, link)
        checked += 1
    assert checked > 20 and raised > checked // 2


@pytest.mark.parametrize("shard", ["none", "full", "grad-op"])
def test_one_copy_predicts_like_the_whole_plan(shard: str) -> None:
    """For width > 1 the search simulates copy 0 alone (auto/copies.py): same time and memory
    as simulating and asking the memory model about every copy, sharded or not (copy 0 is
    told it holds 1/w of each stage)."""
    from pipeweave.auto.predict import candidate_plan
    from pipeweave.planner.memory import predicted_memory
    from pipeweave.schedules import build_schedule
    from pipeweave.sim import simulate

    profile = small_profile(8, blocks=8, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("time",), microbatches=(4, 8), depths=(2,),
                          shard=(shard,))
    state = _Search(problem, lambda _text: None)
    checked = 0
    for candidate in enumerate_candidates(problem):
        if not _valid_shape(candidate, problem):
            continue
        try:
            done, plan, scaled = state.complete(candidate)
            prediction = predict(done, scaled, problem)
        except ValueError:
            continue
        assert plan.width == 2 and plan.shard == shard
        whole = simulate(build_schedule(plan.schedule, plan.shape(
            1 if get_info(plan.schedule).synchronous else 4)),
            candidate_costs(done, candidate_plan(done, problem), scaled, problem))
        assert prediction.iteration_time == pytest.approx(whole.iteration_time, rel=1e-9)
        memory = [r.total for r in predicted_memory(profile, plan, batch_size=problem.batch)]
        assert list(prediction.peak_memory_bytes) == pytest.approx(memory, rel=1e-9)
        checked += 1
    assert checked > 10
