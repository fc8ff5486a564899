"""``planner.pipedream_cache``: the remembered DP gives, with ``==``, what
``pipedream_partition`` gives asked directly, and solves a straight problem once for all its
power-of-two scalings (the micro-batch sizes ``pipeweave auto`` asks)."""

from __future__ import annotations

import random

import pytest

from pipeweave.planner import Topology, pipedream_partition
from pipeweave.planner.pipedream_cache import pipedream_solution, solution_cache

Blocks = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...],
               tuple[float, ...]]

TOPOLOGIES = [Topology.single(4, 1e9), Topology.single(7, 3e8), Topology.parse("2x1e10,3x1e9")]


def blocks(seed: int, n: int, *, ties: bool) -> Blocks:
    """Block times, parameter, output, activation and optimizer bytes; ``ties``: times from
    a few values (equal stages, where the first choice must be kept)."""
    rng = random.Random(seed)
    if ties:
        compute = tuple(rng.choice([1.0, 2.0, 3.0]) * 1e-3 for _ in range(n))
    else:
        compute = tuple(rng.uniform(1e-4, 5e-3) for _ in range(n))
    params = tuple(rng.uniform(1e5, 1e7) for _ in range(n))
    outputs = tuple(rng.choice([1e5, 4e5, rng.uniform(1e4, 1e6)]) for _ in range(n))
    activations = tuple(rng.uniform(1e5, 1e6) for _ in range(n))
    return compute, params, outputs, activations, tuple(2 * p for p in params)


def scaled(problem: Blocks, factor: float) -> Blocks:
    """The problem at a micro-batch ``factor`` times larger: times and sent bytes scale."""
    compute, params, outputs, activations, optimizer = problem
    return (tuple(c * factor for c in compute), params, tuple(o * factor for o in outputs),
            tuple(a * factor for a in activations), optimizer)


def direct(problem: Blocks, topology: Topology, straight: bool):  # type: ignore[no-untyped-def]
    compute, params, outputs, activations, optimizer = problem
    return pipedream_partition(compute, params, outputs, topology, straight=straight,
                               activation_bytes=activations, optimizer_bytes=optimizer)


def remembered(problem: Blocks, topology: Topology, straight: bool):  # type: ignore[no-untyped-def]
    return pipedream_solution(*problem, topology, straight=straight, overlap=True,
                              memory_limit=None)


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
@pytest.mark.parametrize("straight", [True, False])
@pytest.mark.parametrize("ties", [True, False])
def test_same_answer_as_asked_directly_on_every_scale(topology: Topology, straight: bool,
                                                      ties: bool) -> None:
    for seed in range(4):
        base = blocks(seed, 9 + 4 * seed, ties=ties)
        for factor in (2.0 ** -3, 0.5, 1.0, 2.0, 8.0, 3.0, 0.3):
            problem = scaled(base, factor)
            assert remembered(problem, topology, straight) == direct(problem, topology, straight)


def test_a_straight_problem_is_solved_once_for_its_power_of_two_scalings() -> None:
    base, topology = blocks(11, 30, ties=False), Topology.single(6, 1e9)
    solution_cache.cache_clear()
    answers = [remembered(scaled(base, 2.0 ** k), topology, True) for k in range(-3, 4)]
    assert solution_cache.cache_info().misses == 1
    assert answers[3] == direct(base, topology, True)
    for k, answer in zip(range(-3, 4), answers):
        assert answer.time_per_minibatch == direct(base, topology, True).time_per_minibatch * 2.0 ** k
    remembered(scaled(base, 3.0), topology, True)  # not a power of two: a problem of its own
    assert solution_cache.cache_info().misses == 2


def test_replication_and_a_memory_limit_are_solved_as_given() -> None:
    base, topology = blocks(5, 20, ties=False), Topology.single(4, 1e9)
    solution_cache.cache_clear()
    for k in range(3):
        remembered(scaled(base, 2.0 ** k), topology, False)
    assert solution_cache.cache_info().misses == 3
    limit = 4e9
    for k in range(3):
        problem = scaled(base, 2.0 ** k)
        assert pipedream_solution(*problem, topology, straight=True, overlap=True,
                                  memory_limit=limit) == pipedream_partition(
            problem[0], problem[1], problem[2], topology, straight=True, memory_limit=limit,
            activation_bytes=problem[3], optimizer_bytes=problem[4])
    assert solution_cache.cache_info().misses == 6
