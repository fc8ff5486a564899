"""``auto`` searches how stages are held over their data-parallel copies (``shard``): the
simulator times a sharded plan's gathers and reduce-scatter (planner/sharded_costs.py, checked
against the ring formulas by hand), the memory model its sharded state, and under a memory
limit no replicated plan meets, the search picks a sharded one that does."""

from __future__ import annotations

import dataclasses

import pytest

from auto_fixtures import completions, small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates, search
from pipeweave.auto.floors import StateFloor
from pipeweave.auto.memory import static_memory
from pipeweave.auto.predict import predict
from pipeweave.planner import Plan
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.sharded_costs import ring_phase_time
from pipeweave.profiler import BlockProfile, LinkProfile, Profile


def test_ring_phase_by_hand() -> None:
    # 8 MB over 4 ranks at 1 GB/s: each rank sends and receives 3 of 4 chunks, twice 6 ms
    assert ring_phase_time(8e6, 4, 1e9) == pytest.approx(2 * 3 * 8e6 / (4 * 1e9))
    assert ring_phase_time(8e6, 4, 1e9, latency=1e-4) == pytest.approx(0.012 + 3e-4)
    assert ring_phase_time(8e6, 1, 1e9) == 0.0
    assert ring_phase_time(8e6, 2, float("inf"), latency=1e-4) == pytest.approx(1e-4)


@pytest.mark.parametrize("shard", ["full", "grad-op"])
def test_sharded_costs_by_hand(shard: str) -> None:
    profile = small_profile(0, blocks=4)
    bounds = ((0, 2), (2, 4))
    network = Network(bandwidth=1e9, allreduce_bandwidth=5e8)
    plain = plan_costs(profile, bounds, network, replicas=(2, 2))
    sharded = plan_costs(profile, bounds, network, replicas=(2, 2), shard=shard)
    for s, (a, e) in enumerate(bounds):
        blocks = profile.blocks[a:e]
        # one ring phase per block, (D - 1) / D of it sent twice: |w_b| / B at D = 2
        gather = sum(b.parameter_bytes / 5e8 for b in blocks)
        assert sharded.forward[s] == pytest.approx(plain.forward[s] + gather)
        again = gather if shard == "full" else 0.0
        assert sharded.backward[s] == pytest.approx(plain.backward[s] + again)
        # a split backward's I and W each gather as a B does (the W by the stage itself)
        assert sharded.input_grad[s] == pytest.approx(plain.input_grad[s] + again)
        assert sharded.weight_grad[s] == pytest.approx(plain.weight_grad[s] + again)
        # the reduce-scatter is half the all-reduce (one phase of two)
        assert sharded.all_reduce[s] == pytest.approx(plain.all_reduce[s] / 2)


def _heavy_profile() -> Profile:
    """Two blocks whose weights outweigh their activations, as in a large model's: a
    pipeline is at most two deep, so 8 ranks run 4 or 8 copies of it, and only sharding
    spreads a stage's state over them."""
    return Profile(tuple(
        BlockProfile(f"b{i}", forward=2e-3 + 1e-4 * i, backward=4e-3, output_bytes=2e5,
                     activation_bytes=1e5, parameter_bytes=20e6, optimizer_bytes=0.0,
                     update=1e-4)
        for i in range(2)), model="heavy", batch_size=2, device="synthetic",
        source="synthetic", link=LinkProfile(1e9, 1e-5))


def _problem(limit: float | None, **extra: object) -> AutoProblem:
    profile = _heavy_profile() if extra.pop("heavy", False) else small_profile(
        7, blocks=8, link=LinkProfile(1e9, 1e-5))
    extra.setdefault("schedules", ("1f1b", "gpipe"))
    return AutoProblem(profile=profile, ranks=8 if profile.model == "heavy" else 4,
                       memory_limit=limit, methods=("uniform", "time"),
                       **extra)  # type: ignore[arg-type]


def test_the_axis_offers_sharding_only_under_a_limit_or_when_asked() -> None:
    def modes(problem: AutoProblem) -> set[str]:
        return {c.shard for c in enumerate_candidates(problem)}

    assert modes(_problem(None)) == {"none"}
    assert modes(_problem(1e12)) == {"none", "full", "grad-op"}
    assert modes(_problem(None, shard=("none", "full"))) == {"none", "full"}
    # a width-1 candidate has nothing to shard over
    assert all(c.shard == "none" for c in enumerate_candidates(_problem(1e12))
               if c.width == 1)
    # split-backward schedules shard too (their I and W gather and reduce as B does)
    assert modes(_problem(1e12, schedules=("zb-h1",))) == {"none", "full", "grad-op"}


def _least_memory(problem: AutoProblem) -> dict[bool, float]:
    """The least predicted peak of any candidate, replicated (False) and sharded (True)."""
    least = {False: float("inf"), True: float("inf")}
    for candidate, done, _, profile in completions(problem):
        try:
            peak = predict(done, profile, problem).max_memory
        except ValueError:
            continue
        sharded = candidate.shard != "none"
        least[sharded] = min(least[sharded], peak)
    return least


def test_under_a_limit_replication_cannot_meet_auto_shards() -> None:
    free = search(_problem(None, heavy=True))
    least = _least_memory(_problem(1e12, heavy=True))
    assert least[True] < least[False]
    limit = (least[True] + least[False]) / 2
    result = search(_problem(limit, heavy=True))
    winner = result.winner
    assert winner.candidate.shard in ("full", "grad-op")
    assert winner.max_memory <= limit
    assert winner.plan.shard == winner.candidate.shard and winner.plan.width > 1
    # the search's memory is the memory model's for the plan it writes
    ranks = predicted_memory(result.problem.profile, winner.plan,
                             batch_size=result.problem.batch)
    assert list(winner.peak_memory_bytes) == pytest.approx([r.total for r in ranks], rel=1e-9)
    # the same training: sharding changes where state lives, not the learning rule
    assert winner.candidate.training() == "exact"
    assert free.winner.samples_per_second >= winner.samples_per_second
    # replicated stages only: nothing fits, said in one line naming the limit
    with pytest.raises(ValueError, match="memory"):
        search(_problem(limit, heavy=True, shard=("none",))).winner


def test_state_floor_stays_below_the_sharded_state() -> None:
    problem = _problem(1e12)
    floor = StateFloor(problem)
    checked = 0
    for candidate in enumerate_candidates(problem):
        if candidate.shard == "none" or candidate.method != "uniform":
            continue
        plan = Plan.uniform(problem.profile.num_blocks, candidate.depth,
                            schedule=candidate.schedule, microbatches=candidate.microbatches,
                            width=candidate.width, shard=candidate.shard)
        assert floor(candidate) <= max(static_memory(problem, plan)) * (1 + 1e-12)
        unsharded = dataclasses.replace(candidate, shard="none")
        assert floor(candidate) < floor(unsharded)
        checked += 1
    assert checked > 4
