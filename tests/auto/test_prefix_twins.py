"""auto/prefix_twins.py: a recompute prefix is bounded, before its partition, by what its
twin recomputing fewer stages was found to take; the bound stays below its simulated time,
is tight enough that a 5 % inflation breaks it, and the search prunes with it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from auto_fixtures import completions, small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.predict import simulate_candidate
from pipeweave.auto.prefix_twins import PrefixTwins
from pipeweave.auto.problem import Candidate
from pipeweave.profiler import LinkProfile

search_module = importlib.import_module("pipeweave.auto.search")


def _problem(seed: int, **changes: object) -> AutoProblem:
    profile = small_profile(seed, blocks=8, link=LinkProfile(2e8, 1e-5))
    problem = AutoProblem(profile=profile, ranks=4, memory_limit=1e15,
                          methods=("uniform", "time", "parameters"),
                          recompute=tuple(range(9)))
    return dataclasses.replace(problem, **changes)


def _times(problem: AutoProblem) -> list[tuple[Candidate, float]]:
    """Every synchronous candidate of ``problem`` (uncompleted) with its simulated time."""
    out = []
    for candidate, done, _, scaled in completions(problem, synchronous_only=True):
        try:
            out.append((candidate, simulate_candidate(done, scaled, problem).iteration_time))
        except ValueError:
            continue
    return out


@pytest.mark.parametrize("seed", [0, 3])
def test_a_prefix_is_bounded_by_its_twins_recomputing_fewer_stages(seed: int) -> None:
    """Record the times of the candidates recomputing ``j`` stages; every candidate of the
    same group recomputing ``k > j`` simulates no faster: on every synchronous schedule,
    every method, with and without APC. Some bound is within 5 % of its time, so a bound
    inflated by 5 % would fail here."""
    problem = _problem(seed, apc=(False, True))
    times = _times(problem)
    checked, tightest = 0, 0.0
    for fewer in range(8):
        twins = PrefixTwins(problem)
        for candidate, time in times:
            if candidate.recompute == fewer:
                twins.record(candidate, time)
        for candidate, time in times:
            if candidate.recompute <= fewer:
                continue
            bound = twins.bound(candidate)
            assert bound <= time * (1 + 1e-12), (candidate, bound, time)
            if bound > 0:
                checked += 1
                tightest = max(tightest, bound / time)
    assert checked > 500
    assert tightest * 1.05 > 1.0 + 1e-9, tightest


def test_no_bound_where_the_premise_fails() -> None:
    """The Slicer's options are filled from the (recomputed) costs, and shared cores' slowdowns
    are not monotone: neither is bounded by a twin; another group, or a twin recomputing
    more stages, never bounds a candidate."""
    problem = _problem(0)
    base = Candidate(schedule="1f1b", method="time", depth=4, width=1, chunks=1, pipelines=1,
                     microbatches=8, recompute=0, apc=False)
    twins = PrefixTwins(problem)
    twins.record(base, 1.0)
    assert twins.bound(dataclasses.replace(base, recompute=2)) == 1.0
    assert twins.bound(dataclasses.replace(base, method="uniform", recompute=2)) == 0.0
    twins.record(dataclasses.replace(base, recompute=3), 2.0)
    assert twins.bound(dataclasses.replace(base, recompute=2)) == 1.0
    assert twins.bound(dataclasses.replace(base, recompute=4)) == 2.0
    sliced = dataclasses.replace(base, schedule="sliced-1f1b")
    twins.record(sliced, 1.0)
    assert twins.bound(dataclasses.replace(sliced, recompute=2)) == 0.0
    shared = PrefixTwins(dataclasses.replace(problem, shared_cores=2))
    shared.record(base, 1.0)
    assert shared.bound(dataclasses.replace(base, recompute=2)) == 0.0


def test_the_search_prunes_prefixes_before_partitioning_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the prefix twins the search completes (partitions and builds) fewer candidates
    and picks the same winner with the same time and memory as without them."""
    problem = _problem(2, memory_limit=None, recompute=tuple(range(9)))
    calls = {"count": 0}
    complete = search_module._Search.complete

    def counted(self: object, candidate: Candidate) -> object:
        calls["count"] += 1
        return complete(self, candidate)  # type: ignore[arg-type]

    monkeypatch.setattr(search_module._Search, "complete", counted)
    pruned = search(problem)
    with_twins = calls["count"]
    calls["count"] = 0
    monkeypatch.setattr(PrefixTwins, "bound", lambda self, candidate: 0.0)
    every = search(problem)
    assert with_twins < calls["count"]
    assert pruned.winner.candidate == every.winner.candidate
    assert pruned.winner.iteration_time == every.winner.iteration_time
    assert pruned.winner.max_memory == every.winner.max_memory
