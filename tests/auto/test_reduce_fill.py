"""auto/reduce_fill.py: the fill and drain with every stage's own all-reduce stays below the
simulated time of every split of random blocks (replicated stages, all-reduces at per-stage
links), and above the fill bound closed by block 0 alone on many; in the search's
``reduce_bound`` it stays below every candidate the partition methods make (recomputing
prefixes, sharded, ties)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from test_bounds import _simulated
from test_fill_bound import _splits
from test_pruning_exact import _exhaustive, search_module
from pipeweave.auto import AutoProblem
from pipeweave.auto.bounds import reduce_bound
from pipeweave.auto.fill_bound import WINDOWS, fill_bound
from pipeweave.auto.reduce_fill import Blocks, contiguous_shares, reduce_fill_bound
from pipeweave.planner import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile, TieProfile
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate

WIDTH = 2


def _blocks(rng: random.Random, count: int) -> list[tuple[float, float, float, float]]:
    """``(f, b, bytes, update)`` per block; the first and last hold many bytes (the
    embedding and the head)."""
    out = []
    for index in range(count):
        f = rng.uniform(0.2, 2)
        held = rng.uniform(0.5, 2) * (f * 4 if index in (0, count - 1) else f)
        out.append((f, f * rng.uniform(0.5, 3), held, rng.uniform(0, 0.1)))
    return out


def _summary(blocks: list[tuple[float, float, float, float]]) -> Blocks:
    work = [f + b for f, b, _, _ in blocks]
    return Blocks(work=sum(work), forward_share=min(f / w for (f, *_), w in zip(blocks, work)),
                  shares=contiguous_shares(work, [p for _, _, p, _ in blocks]),
                  first=(work[0], blocks[0][2], blocks[0][3]),
                  last=(work[-1], blocks[-1][2], blocks[-1][3]))


@pytest.mark.parametrize("name", sorted(WINDOWS))
@pytest.mark.parametrize("seed", range(6))
def test_bound_is_below_every_split(name: str, seed: int) -> None:
    """7 random blocks, every split into 2-4 stages, ``n`` micro-batches per copy of two:
    the simulated time is at least the bound; on many splits the bound is above the fill
    bound closed by block 0's all-reduce (the other stages' all-reduces counted)."""
    rng = random.Random(seed)
    blocks = _blocks(rng, 7)
    summary = _summary(blocks)
    checked = raised = 0
    for depth in range(2, 5):
        per_byte = tuple(rng.uniform(0.3, 2.0) for _ in range(depth))
        for cuts in _splits(len(blocks), depth):
            sums = [[sum(x[i] for x in blocks[a:e]) for i in range(4)] for a, e in cuts]
            costs = Costs(forward=[s[0] for s in sums], backward=[s[1] for s in sums],
                          comm=[rng.uniform(0, 0.3) for _ in range(depth - 1)], latency=0.01,
                          update=[s[3] for s in sums],
                          all_reduce=[k * s[2] for k, s in zip(per_byte, sums)])
            for n in (depth + 1, 2 * depth, 12):
                plan = Plan.uniform(len(blocks), depth, schedule=name, microbatches=WIDTH * n,
                                    width=WIDTH)
                time = simulate(build_schedule(name, plan.shape(1)), costs).iteration_time
                bound = reduce_fill_bound(name, n, summary, per_byte)
                assert bound <= time * (1 + 1e-9), (cuts, n, bound, time)
                closed = fill_bound(name, depth, n, summary.work) \
                    + per_byte[0] * blocks[0][2] + blocks[0][3]
                raised += bound > 1.01 * closed
                checked += 1
    assert checked > 100 and raised >= 10, (checked, raised)


def test_no_bound_without_declared_windows() -> None:
    summary = Blocks(work=10.0, forward_share=0.3, shares=((1.0, 0.0),),
                     first=(1.0, 1.0, 0.0), last=(1.0, 1.0, 0.0))
    assert reduce_fill_bound("zb-h2", 16, summary, (1.0, 1.0)) == 0.0
    assert reduce_fill_bound("1f1b", 16, summary, (1.0,)) == 0.0
    assert reduce_fill_bound("1f1b", 2, summary, (1.0,) * 4) == 0.0  # n <= S: no form A
    assert reduce_fill_bound("1f1b", 16, summary, (1.0,) * 4) > 0.0


@pytest.mark.parametrize("tied,shared_cores", [(False, None), (True, None), (False, 3)])
def test_reduce_bound_is_below_every_candidate(tied: bool, shared_cores: int | None) -> None:
    """Every candidate the methods make on a slow second level (replicas of a stage on two
    machines), recomputing prefixes and sharded ones included, also with eight ranks on
    three cores: ``reduce_bound`` is below its simulated time, and positive on many."""
    profile = small_profile(4, blocks=12, link=LinkProfile(1e11, 1e-6))
    if tied:
        shared = min(profile.blocks[0].parameter_bytes, profile.blocks[11].parameter_bytes)
        profile = replace(profile, ties=(TieProfile((0, 11), shared),))
    problem = AutoProblem(profile=profile, ranks=8, topology=Topology.parse("4x1e11,2x2e8"),
                          shared_cores=shared_cores, schedules=tuple(sorted(WINDOWS)),
                          methods=("uniform", "time", "parameters"), microbatches=(8, 16, 32),
                          recompute=(0, 1, 2, 12), shard=("none", "full", "grad-op"))
    checked = positive = 0
    for candidate, _, scaled, _, time in _simulated(problem):
        bound = reduce_bound(candidate, scaled, problem)
        assert bound <= time * (1 + 1e-9), (candidate, bound, time)
        positive += bound > 0
        checked += 1
    assert checked > 50 and positive > checked // 4, (checked, positive)


def test_the_search_prunes_with_it_and_keeps_the_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a slower second level the search asks ``reduce_bound`` of what the shape bound
    left: it partitions fewer candidates than without it (93 against 101), and picks the
    exhaustive search's winner (every bound and floor off,
    ``test_pruning_exact._exhaustive``)."""
    profile = small_profile(1, blocks=12, link=LinkProfile(1e11, 1e-6))
    problem = AutoProblem(profile=profile, ranks=8, topology=Topology.parse("4x1e11,2x1e9"),
                          schedules=("1f1b", "avgpipe", "gpipe"), methods=("uniform", "time"),
                          microbatches=(8, 16, 32), recompute=(0, 1, 12))
    completed = []
    complete = search_module._Search.complete
    with monkeypatch.context() as patch:
        patch.setattr(search_module._Search, "complete",
                      lambda self, candidate: completed.append(candidate) or complete(
                          self, candidate))
        pruned = search_module.search(problem)
        with_it = len(completed)
        patch.setattr(search_module, "reduce_bound", lambda *args: 0.0)
        without = search_module.search(problem)
    every = _exhaustive(problem, monkeypatch)
    assert with_it < len(completed) - with_it, (with_it, len(completed) - with_it)
    assert pruned.winner.iteration_time == pytest.approx(every.winner.iteration_time,
                                                         rel=1e-12)
    assert pruned.winner.candidate == without.winner.candidate
