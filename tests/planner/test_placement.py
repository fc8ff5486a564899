"""WPipe's placement: the rank maps, their predicted communication by hand, WPipe's rule."""

from __future__ import annotations

import math
import random

import pytest

from pipeweave.ir import Layout
from pipeweave.planner import Evaluator, Topology, plan_costs, uniform_partition
from pipeweave.planner.placement import placements, profile_traffic, runtime_table

from planner_fixtures import random_profile

NVLINK, ETHERNET = 1.2e10, 1.25e9
CLUSTER = Topology.parse(f"4x{NVLINK},4x{ETHERNET}")  # 4 machines of 4 GPUs


def by_name(found):  # type: ignore[no-untyped-def]
    return {p.name: p for p in found if p.name != "mixed"}


def test_cnn_traffic_keeps_the_pipeline_inside_machines() -> None:
    # WPipe Table 3 (ResNeXt, 4:16): the pipeline traffic is the larger, so A (pipeline inside
    # machines, all-reduce across) wins. d = w = 4, 1 GB over each boundary, 100 MB per stage.
    found = placements(CLUSTER, 4, 4, p2p_bytes=1e9, allreduce_bytes=1e8)
    best, named = found[0], by_name(found)
    assert best.name == "pipeline-inner" and best.wpipe_rule and best.runtime
    assert [p.wpipe_rule for p in found].count(True) == 1
    assert [p.runtime for p in found].count(True) == 1
    # by hand: A sends 3 x 1 GB over NVLink and all-reduces 4 (4-1)/4 x 100 MB over Ethernet
    a, b = named["pipeline-inner"], named["data-inner"]
    assert a.p2p_time == pytest.approx(3e9 / 1.2e10)            # 0.25 s
    assert a.allreduce_time == pytest.approx(3e8 / 1.25e9)      # 0.24 s
    assert b.p2p_time == pytest.approx(3e9 / 1.25e9)            # 2.4 s
    assert b.allreduce_time == pytest.approx(3e8 / 1.2e10)      # 0.025 s
    assert a.communication_time == pytest.approx(0.49)
    assert b.communication_time == pytest.approx(2.425)
    # the split (2, 2): stages 0-1 and 2-3 on one machine each, replicas across both levels
    mixed = [p for p in found if p.name == "mixed"]
    assert [(p.pipeline_split, p.data_split) for p in mixed] == [((2, 2), (2, 2))]
    assert mixed[0].p2p_bandwidth == (NVLINK, ETHERNET, NVLINK)
    assert mixed[0].communication_time == pytest.approx(2e9 / NVLINK + 1e9 / ETHERNET + 0.24)
    assert [p.name for p in found] == ["pipeline-inner", "mixed", "data-inner"]


def test_transformer_traffic_keeps_the_all_reduce_inside_machines() -> None:
    # BERT-like: small activations, large weights -> B (replicas inside machines) wins
    found = placements(CLUSTER, 4, 4, p2p_bytes=1e7, allreduce_bytes=1e9)
    best = found[0]
    assert best.name == "data-inner" and best.wpipe_rule and not best.runtime
    assert best.table == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert best.p2p_bandwidth == (ETHERNET,) * 3 and best.allreduce_bandwidth == (NVLINK,) * 4
    assert best.communication_time == pytest.approx(3e7 / ETHERNET + 3e9 / NVLINK)


def test_flat_topology_gives_equal_times() -> None:
    found = placements(Topology.single(16, 1e10), 4, 4, p2p_bytes=1e9, allreduce_bytes=1e8)
    assert {p.name for p in found} == {"pipeline-inner", "data-inner"}
    assert len({p.communication_time for p in found}) == 1
    assert found[0].communication_time == pytest.approx(3e9 / 1e10 + 3e8 / 1e10)
    assert found[0].name == "pipeline-inner"  # ties keep the runtime's map first


@pytest.mark.parametrize("depth,width", [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)])
def test_every_table_is_a_bijection_and_the_runtime_map_is_the_layouts(depth: int, width: int) -> None:
    found = placements(CLUSTER, depth, width, p2p_bytes=1.0, allreduce_bytes=1.0)
    for p in found:
        assert sorted(r for row in p.table for r in row) == list(range(16))
        assert p.rank_of(depth - 1, width - 1) == p.table[-1][-1]
    runtime = next(p for p in found if p.runtime)
    assert runtime.table == runtime_table(depth, width)
    assert list(runtime.table) == [tuple(r) for r in Layout.data_parallel(depth, width).stage_ranks]
    assert [p.wpipe_rule for p in found].count(True) == 1


def test_depth_that_does_not_split_along_the_levels_still_prices_both_named_maps() -> None:
    # 6 x 2 on 3 machines of 4: the runtime's copy 0 is ranks 0-5 (crossing machines between
    # stages 3 and 4, ranks 3 -> 4), copy 1 ranks 6-11 (crossing between stages 1 and 2, ranks
    # 7 -> 8); a boundary is as slow as its slowest copy
    found = placements(Topology.parse("4x1e10,3x1e9"), 6, 2, p2p_bytes=1.0, allreduce_bytes=0.0)
    runtime = next(p for p in found if p.runtime)
    assert runtime.p2p_bandwidth == (1e10, 1e9, 1e10, 1e9, 1e10)
    assert {p.name for p in found} >= {"pipeline-inner", "data-inner"}


def test_rule_picks_the_cheaper_named_map_on_two_levels() -> None:
    # m machines of m GPUs, d = w = m: A puts all pipeline traffic on the fast level and the
    # all-reduce on the slow one, B the reverse, so the larger traffic belongs on the fast one
    rng = random.Random(0)
    for _ in range(200):
        m = rng.choice([2, 4, 8])
        topology = Topology.parse(f"{m}x{rng.uniform(5, 50) * 1e9},{m}x{rng.uniform(0.5, 4) * 1e9}")
        x, y = rng.uniform(0, 1e9), rng.uniform(0, 1e9)
        named = by_name(placements(topology, m, m, p2p_bytes=x, allreduce_bytes=y))
        ruled = next(p for p in named.values() if p.wpipe_rule)
        assert ruled.communication_time <= min(p.communication_time for p in named.values()) + 1e-12


def test_network_feeds_plan_costs_the_same_links() -> None:
    # the placement's prediction is the simulator's own cost model: what plan_costs charges
    # per transfer x 2M, summed over the boundaries, and its slowest all-reduce
    profile = random_profile(random.Random(3), 12)
    depth, width, per_copy = 4, 4, 3
    bounds = uniform_partition(12, depth)
    p2p, reduce = profile_traffic(profile, bounds, per_copy)
    for p in placements(CLUSTER, depth, width, p2p_bytes=p2p, allreduce_bytes=reduce):
        costs = plan_costs(profile, bounds, p.network(), replicas=(width,) * depth)
        assert sum(2 * per_copy * c for c in costs.comm) == pytest.approx(p.p2p_time)
        assert max(costs.all_reduce) == pytest.approx(p.allreduce_time)
        simulated = Evaluator(profile, "1f1b", depth, per_copy * width, p.network(),
                              replicas=(width,) * depth)(bounds)
        assert math.isfinite(simulated.iteration_time)


@pytest.mark.parametrize("kwargs,message", [
    ({"depth": 3, "width": 4}, "d x w = 16"),
    ({"depth": 0, "width": 16}, "depth must be an integer >= 1"),
    ({"depth": 4, "width": 4, "p2p_bytes": [1.0, 2.0]}, "one per boundary (3)"),
    ({"depth": 4, "width": 4, "allreduce_bytes": [1.0]}, "one per stage (4)"),
    ({"depth": 4, "width": 4, "p2p_bytes": -1.0}, "finite byte counts"),
])
def test_mistakes_name_the_value_and_the_fix(kwargs: dict, message: str) -> None:
    arguments = {"p2p_bytes": 1.0, "allreduce_bytes": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        placements(CLUSTER, **arguments)
