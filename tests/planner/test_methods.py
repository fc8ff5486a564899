"""make_plan for every method: valid runtime plans, the report, memory limits and clear errors."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipeweave.planner import PlanRequest, Topology, available_methods, make_plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.methods import held_microbatches, straight_network
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.runtime import Plan
from planner_fixtures import PROFILES, gpt_profile, random_profile

needs_profiles = pytest.mark.skipif(not PROFILES.exists(), reason="reference profiles not present")


def test_registry() -> None:
    assert available_methods() == ["autopipe", "parameters", "pipedream", "time", "uniform"]
    with pytest.raises(ValueError, match="unknown planner method 'fastest'; choose one of autopipe, "
                                         "parameters, pipedream, time, uniform"):
        make_plan(PlanRequest(gpt_profile(2), 2), "fastest")


@pytest.mark.parametrize("method", ["uniform", "parameters", "time", "autopipe", "pipedream"])
def test_every_method_writes_a_loadable_plan(method: str, tmp_path: Path) -> None:
    profile = gpt_profile(6)
    result = make_plan(PlanRequest(profile, 4, microbatches=8), method)
    path = tmp_path / "plan.json"
    result.plan.save(path)
    plan = Plan.load(path)
    assert plan == result.plan and plan.num_blocks == profile.num_blocks == 14
    assert plan.world_size == 4
    report = result.to_json()
    for key in ("stages", "replicas", "balance", "predicted_iteration_time", "planning_seconds"):
        assert key in report
    assert report["stages"] == [list(s) for s in plan.stages]
    assert report["balance"] >= 1.0 and report["predicted_iteration_time"] > 0
    assert report["planning_seconds"] >= 0


def test_report_numbers() -> None:
    # four equal blocks and a double one: time puts [0,2) [2,4) [4,5) -> stage times 2 2 2
    blocks = [BlockProfile(f"b{i}", 1 / 3, 2 / 3, 0.0, 0.0, 1.0) for i in range(4)]
    blocks.append(BlockProfile("big", 2 / 3, 4 / 3, 0.0, 0.0, 8.0))
    profile = Profile(tuple(blocks))
    result = make_plan(PlanRequest(profile, 3, microbatches=3), "time")
    assert result.plan.stages == ((0, 2), (2, 4), (4, 5))
    assert result.stage_times == pytest.approx((2.0, 2.0, 2.0)) and result.balance == pytest.approx(1.0)
    # 1F1B, equal stages F=2/3, B=4/3, free links: (M + P - 1)(F + B) = 5 x 2
    assert result.predicted_iteration_time == pytest.approx(10.0)
    by_parameters = make_plan(PlanRequest(profile, 2), "parameters")
    assert by_parameters.plan.stages == ((0, 4), (4, 5))  # 4 vs 8 parameter bytes: min-max
    uniform = make_plan(PlanRequest(profile, 4), "uniform")  # [0,2) [2,3) [3,4) [4,5): 2 1 1 2
    assert uniform.plan.stages == ((0, 2), (2, 3), (3, 4), (4, 5))
    assert uniform.balance == pytest.approx(2 / 1.5)


@needs_profiles
def test_pipedream_plan_for_vgg16() -> None:
    profile = Profile.load(PROFILES / "vgg16.txt")
    result = make_plan(PlanRequest(profile, 16, topology=Topology.single(16, 1e9)), "pipedream")
    assert result.replicas == (15, 1) and result.plan.schedule == "pipedream"
    assert result.plan.microbatches % 15 == 0  # whole rounds of the 15 replicas
    assert result.details["predicted_time_per_minibatch"] == pytest.approx(0.044159, abs=5e-7)
    assert result.details["noam"] == 2
    assert result.plan.world_size == 16
    # the simulated asynchronous 1F1B-RR steady state runs no faster than the DP's bound per minibatch
    per_minibatch = result.predicted_iteration_time / result.plan.microbatches
    assert per_minibatch >= result.details["predicted_time_per_minibatch"] * 0.99


def test_memory_limit_shapes_the_time_partition() -> None:
    rng = random.Random(3)
    profile = random_profile(rng, 8)
    free = make_plan(PlanRequest(profile, 3, microbatches=6), "time")

    def peak(plan: Plan) -> float:  # the memory model, as the plan's check asks it
        return max(r.total for r in predicted_memory(profile, plan, batch_size=6, optimizer=None))

    # the held micro-batches the partition's memory mask uses, read off the schedule
    assert [held_microbatches("1f1b", 3, 6, s) for s in range(3)] == [3, 2, 1]
    assert [held_microbatches("gpipe", 3, 6, s) for s in range(3)] == [6, 6, 6]
    limit = peak(free.plan) * 0.9  # the unconstrained optimum does not fit
    bounded = make_plan(PlanRequest(profile, 3, microbatches=6, memory_limit=limit), "time")
    assert bounded.plan.stages != free.plan.stages and peak(bounded.plan) <= limit
    assert max(bounded.stage_times) >= max(free.stage_times)
    with pytest.raises(ValueError, match="no partition of 8 blocks into 3 stages satisfies"):
        make_plan(PlanRequest(profile, 3, microbatches=6, memory_limit=1.0), "time")
    with pytest.raises(ValueError, match=r"needs .* bytes on rank .* but --memory-limit is 1"):
        make_plan(PlanRequest(profile, 3, microbatches=6, memory_limit=1.0), "uniform")


def test_request_errors() -> None:
    profile = gpt_profile(1)  # 4 blocks
    with pytest.raises(ValueError, match="cannot split 4 blocks into 5 stages"):
        make_plan(PlanRequest(profile, 5), "time")
    with pytest.raises(ValueError, match="ranks must be an integer >= 1, got 0"):
        PlanRequest(profile, 0)
    with pytest.raises(ValueError, match="has 8 workers but ranks is 4; make the product"):
        PlanRequest(profile, 4, topology=Topology.parse("4x1e9,2x1e8"))
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'"):
        make_plan(PlanRequest(profile, 2, schedule="zigzag"), "uniform")
    with pytest.raises(ValueError, match="the Slicer splits the warm-up micro-batches of a 1F1B"):
        make_plan(PlanRequest(profile, 2, slicer=True, schedule="gpipe"), "uniform")
    with pytest.raises(ValueError, match="MACHINESxBANDWIDTH"):
        Topology.parse("4:1e9")


def test_straight_network_levels() -> None:
    # 2 servers x 2 GPUs: boundaries after ranks 0 and 2 stay inside a server, after 1 crosses
    request = PlanRequest(gpt_profile(2), 4, topology=Topology.parse("2x1e10,2x1e9"))
    assert straight_network(request).bandwidth == [1e10, 1e9, 1e10]


def test_shared_cores_simulate_the_ranks_splitting_the_cores() -> None:
    """4 ranks on 2 cores: 1F1B's steady state keeps all 4 computing, so the prediction is
    slower than with a device per rank (but not 2x: a rank alone in a bubble runs at full
    speed), and a co-located profile's sharing overhead multiplies the compute."""
    import dataclasses

    profile = gpt_profile(6)
    dedicated = make_plan(PlanRequest(profile, 4, microbatches=8), "time")
    shared = make_plan(PlanRequest(profile, 4, microbatches=8, shared_cores=2), "time")
    assert shared.plan == dedicated.plan
    ratio = shared.predicted_iteration_time / dedicated.predicted_iteration_time
    assert 1.1 < ratio < 2.0
    assert shared.details["shared_cores"] == 2 and shared.details["sharing_overhead"] == 1.0
    assert "shared_cores" not in dedicated.details
    measured = dataclasses.replace(profile, metadata={**profile.metadata, "sharing_overhead": 1.25})
    overhead = make_plan(PlanRequest(measured, 4, microbatches=8, shared_cores=2), "time")
    # compute x 1.25, transfers as they were
    assert 1.2 * shared.predicted_iteration_time < overhead.predicted_iteration_time \
        <= 1.25 * shared.predicted_iteration_time + 1e-12
    # without shared cores the overhead does not apply (a device per rank shares nothing)
    assert make_plan(PlanRequest(measured, 4, microbatches=8), "time").predicted_iteration_time == \
        pytest.approx(dedicated.predicted_iteration_time)
    with pytest.raises(ValueError, match="shared_cores must be an integer >= 1 or None, got 0"):
        PlanRequest(profile, 4, shared_cores=0)
