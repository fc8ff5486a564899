"""Pruning decides nothing: the search with every bound and floor switched off (each
candidate simulated) picks the same winner, with the same predicted time and memory, as the
pruned search, on small problems with and without a memory limit and a link."""

from __future__ import annotations

import pytest

from auto_fixtures import completions, small_profile
import dataclasses
import importlib

from pipeweave.auto import AutoProblem, search
from pipeweave.auto.floors import StateFloor
from pipeweave.auto.twin_key import twin_key
from pipeweave.profiler import LinkProfile

search_module = importlib.import_module("pipeweave.auto.search")


def _exhaustive(problem: AutoProblem, monkeypatch: pytest.MonkeyPatch) -> search_module.SearchResult:
    with monkeypatch.context() as patch:
        patch.setattr(search_module, "_cannot_beat", lambda *args: False)
        patch.setattr(search_module._Search, "over_floor", lambda self, plan: False)
        patch.setattr(StateFloor, "__call__", lambda self, candidate: 0.0)
        patch.setattr(StateFloor, "peak", lambda self, candidate: 0.0)
        patch.setattr(search_module._Search, "twin_bound", lambda self, plan, key: 0.0)
        patch.setattr(search_module, "static_memory", lambda problem, plan: [0.0])
        patch.setattr(search_module, "inflight_floor", lambda *args: [0.0])
        patch.setattr(search_module, "held_floor", lambda problem, plan: [])
        result = search(problem)
    assert result.pruned == 0
    return result


def _problem(seed: int, limit_share: float | None, link: bool) -> AutoProblem:
    profile = small_profile(seed, blocks=8,
                            link=LinkProfile(2e8, 1e-5) if link else None)
    limit = None
    if limit_share is not None:
        total = sum(b.parameter_bytes * 3 + b.activation_bytes for b in profile.blocks)
        limit = limit_share * total
    return AutoProblem(profile=profile, ranks=4, memory_limit=limit,
                       schedules=("1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "avgpipe"),
                       methods=("uniform", "time", "parameters"))


@pytest.mark.parametrize("seed, limit_share, link",
                         [(0, None, False), (1, None, True), (2, 0.8, True), (3, 0.5, False)])
def test_the_pruned_search_picks_the_exhaustive_winner(
        seed: int, limit_share: float | None, link: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _problem(seed, limit_share, link)
    pruned = search(problem)
    every = _exhaustive(problem, monkeypatch)
    assert pruned.pruned > 0  # the bounds did prune something: the comparison means something
    assert every.simulated > pruned.simulated
    best = every.winner.iteration_time
    assert pruned.winner.iteration_time == pytest.approx(best, rel=1e-12)
    # the same winner; where candidates tie to rounding (pure data parallelism is one plan
    # under several schedules, its sums taken in another order), the pruned winner is one of
    # the exhaustive search's tied best
    tied = [p for p in every.ranked if p.iteration_time == pytest.approx(best, rel=1e-12)]
    same = [p for p in tied if p.candidate == pruned.winner.candidate]
    assert same, f"{pruned.winner.candidate} is not among {[p.candidate for p in tied]}"
    assert pruned.winner.max_memory == same[0].max_memory
    if len(tied) == 1:
        assert pruned.winner.candidate == every.winner.candidate


@pytest.mark.parametrize("seed", [0, 7])
def test_the_inflight_floor_is_below_every_predicted_peak(seed: int) -> None:
    """A plan of iteration time T holds at least ``inflight_floor(period=T)`` on every rank
    (auto/floors.py): checked against the memory model for every candidate of a space, every
    synchronous schedule, with replicas, chunks, N pipelines and recomputation."""
    from pipeweave.auto.floors import inflight_floor
    from pipeweave.auto.predict import candidate_costs, predict

    problem = dataclasses.replace(_problem(seed, None, True), schedules=None,
                                  methods=("uniform", "time"))
    checked = 0
    for candidate, done, plan, profile in completions(problem):
        try:
            prediction = predict(done, profile, problem)
        except ValueError:
            continue
        floor = inflight_floor(problem, plan, candidate_costs(done, plan, profile, problem),
                               prediction.iteration_time)
        assert len(floor) == len(prediction.peak_memory_bytes)
        for bound, peak in zip(floor, prediction.peak_memory_bytes):
            assert bound <= peak * (1 + 1e-12), (candidate, bound, peak)
        checked += 1
    assert checked > 500


def test_recomputation_never_shortens_a_plan() -> None:
    """The twin bound's premise (search._Search.twin_bound): a plan recomputing a superset of
    another's stages, the same plan otherwise, simulates no faster; on every synchronous
    schedule, every prefix, with and without APC."""
    from pipeweave.auto.predict import simulate_candidate

    problem = dataclasses.replace(_problem(5, 1e15, True), schedules=None,
                                  methods=("uniform", "time"), recompute=tuple(range(9)),
                                  apc=(False, True))
    times: dict[str, list[tuple[tuple[bool, ...], float]]] = {}
    for _, done, plan, scaled in completions(problem):
        try:
            time = simulate_candidate(done, scaled, problem).iteration_time
        except ValueError:
            continue
        if search_module.get_info(plan.schedule).synchronous:
            key = twin_key(plan.to_json(), done.apc)
            times.setdefault(key, []).append((search_module._recomputed(plan), time))
    pairs = 0
    for twins in times.values():
        for mine, time in twins:
            for theirs, other in twins:
                if mine != theirs and all(m or not t for m, t in zip(mine, theirs)):
                    assert time >= other * (1 - 1e-12), (mine, theirs)
                    pairs += 1
    assert pairs > 200
