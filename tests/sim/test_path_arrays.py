"""AutoPipe's timing on columns (sim/path_arrays.py) gives simulate_path's iteration time and
master stage exactly: on every schedule the columns cover, many shapes, uneven and equal costs
(equal costs tie many paths: the tie-breaking must match), with and without delays; and
AutoPipe's evaluator, which takes that path, still gives the simulator's numbers."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeweave.planner.evaluate import Evaluator, Network, plan_costs
from pipeweave.planner.partition import uniform_partition
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.schedules import Shape, build_schedule
from pipeweave.sim import Costs, simulate_path
from pipeweave.sim import path_arrays as module
from pipeweave.sim.path_arrays import flush_graph, path_arrays

from schedule_grid import random_costs

GRID = list(itertools.product((1, 2, 3, 5), (1, 2), (1, 3, 6, 13), (1, 2)))
NAMES = ["gpipe", "1f1b", "interleaved-1f1b", "gpipe-grouped", "zb-h1", "zb-h2",
         "interleaved-zb", "zbv", "v-half", "v-min", "dualpipev"]


def _cost_cases(stages: int, seed: int) -> list[Costs]:
    if stages == 1:
        return [Costs(forward=1.3, backward=2.1, update=0.4)]
    return [random_costs(stages, seed, latency=0.01), random_costs(stages, seed + 1, latency=0.0),
            random_costs(stages, seed + 2, latency=0.3),
            Costs(forward=1.0, backward=2.0),  # every stage alike: ties everywhere
            Costs(forward=1.0, backward=2.0, comm=0.25, latency=0.5),
            Costs(forward=[1.0 + (s == stages // 2) for s in range(stages)], backward=2.0)]


@pytest.mark.parametrize("name", NAMES)
def test_path_from_columns_is_the_simulators(name: str) -> None:
    timed = 0
    for stages, chunks, microbatches, iterations in GRID:
        shape = Shape(stages=stages, microbatches=microbatches, chunks=chunks,
                      iterations=iterations)
        graph = flush_graph(name, shape)
        if graph is None:
            continue
        schedule = build_schedule(name, shape)
        for costs in _cost_cases(stages * chunks, stages + 7 * microbatches):
            assert path_arrays(graph, costs) == simulate_path(schedule, costs), \
                (stages, chunks, microbatches, iterations, costs)
        timed += 1
    assert timed >= 12


def test_shared_cores_and_uncovered_shapes_are_left_to_the_walk() -> None:
    graph = flush_graph("1f1b", Shape(stages=4, microbatches=8))
    assert graph is not None
    assert path_arrays(graph, random_costs(4, 0, cores=2)) is None
    assert flush_graph("1f1b", Shape(stages=4, microbatches=8, replicas=(1, 2, 1, 1))) is None
    assert flush_graph("1f1b", Shape(stages=4, microbatches=8, options={"sliced": 1})) is None


def test_graphs_are_kept_per_shape() -> None:
    module._CACHE.clear()
    shape = Shape(stages=3, microbatches=6)
    assert flush_graph("1f1b", shape) is flush_graph("1f1b", Shape(stages=3, microbatches=6))
    for m in range(7, 7 + module.CACHE_SIZE):
        flush_graph("1f1b", Shape(stages=3, microbatches=m))
    assert len(module._CACHE) == module.CACHE_SIZE


def test_graphs_are_kept_up_to_an_action_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    module._CACHE.clear()
    actions = 2 * 3 * 8  # an F and a B per stage and micro-batch
    monkeypatch.setattr(module, "CACHE_ACTIONS", 3 * actions)
    for m in range(8, 8 + 5):  # 48, 54, 60, 66, 72 actions
        flush_graph("1f1b", Shape(stages=3, microbatches=m))
    assert [key[2] for key in module._CACHE] == [11, 12]  # 66 + 72 <= 144 < 60 + 66 + 72
    monkeypatch.setattr(module, "CACHE_ACTIONS", 1)
    flush_graph("1f1b", Shape(stages=3, microbatches=20))
    assert [key[2] for key in module._CACHE] == [20]  # the last one always kept


def _profile(blocks: int, seed: int) -> Profile:
    rng = random.Random(seed)
    return Profile([BlockProfile(name=f"b{i}", forward=rng.uniform(0.5, 2),
                                 backward=rng.uniform(1, 4),
                                 activation_bytes=1000, output_bytes=rng.randint(1, 9) * 10**6,
                                 parameter_bytes=1000) for i in range(blocks)])


@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 8), (5, 16), (8, 8)])
def test_autopipe_evaluator_takes_the_columns_and_agrees(stages: int, microbatches: int) -> None:
    profile = _profile(24, stages)
    network = Network(bandwidth=1e9, latency=1e-3)
    evaluator = Evaluator(profile, "1f1b", stages, microbatches, network)
    reference = build_schedule("1f1b", stages=stages, microbatches=microbatches)
    rng = random.Random(microbatches)
    for _ in range(6):
        cuts = sorted(rng.sample(range(1, 24), stages - 1))
        bounds = tuple(zip([0] + cuts, cuts + [24]))
        expected = simulate_path(reference, plan_costs(profile, bounds, network))
        assert evaluator.path(bounds) == expected
    assert evaluator._built is None  # never built as actions: the columns answered
    assert evaluator.path(uniform_partition(24, stages)) == simulate_path(
        reference, plan_costs(profile, uniform_partition(24, stages), network))


def test_autopipe_evaluator_with_shared_cores_walks_and_agrees() -> None:
    profile = _profile(12, 3)
    network = Network(bandwidth=1e9, latency=1e-3, shared_cores=2)
    module._CACHE.clear()
    evaluator = Evaluator(profile, "1f1b", 4, 8, network)
    reference = build_schedule("1f1b", stages=4, microbatches=8)
    for bounds in (uniform_partition(12, 4), ((0, 2), (2, 5), (5, 9), (9, 12))):
        assert evaluator.path(bounds) == simulate_path(reference,
                                                       plan_costs(profile, bounds, network))
    assert not module._CACHE  # no graph built for a walk that cannot use it
