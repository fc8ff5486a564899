"""The time budget (auto/budget.py): what it estimates, and that it skips nothing without
``--time-limit`` and counts everything it skips with one."""

from __future__ import annotations

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.budget import Budget, work_units
from pipeweave.auto.problem import Candidate


def _candidate(depth: int, width: int, microbatches: int) -> Candidate:
    return Candidate(schedule="1f1b", method="uniform", depth=depth, width=width, chunks=1,
                     pipelines=1, microbatches=microbatches, recompute=0, apc=False)


def test_work_units_count_one_copy_when_the_copies_split_the_microbatches() -> None:
    assert work_units(_candidate(4, 1, 8)) == 32
    assert work_units(_candidate(4, 2, 8)) == 16
    assert work_units(_candidate(4, 2, 7)) == 28


def test_budget_estimates_from_the_largest_rate_seen() -> None:
    budget = Budget()
    small, big = _candidate(2, 1, 2), _candidate(8, 1, 8)
    assert budget.fits(big, 0.0)  # nothing measured: nothing skipped
    budget.record_simulation(small, 4.0)  # 1 s per unit
    budget.record_simulation(big, 6.4)    # 0.1 s per unit: the larger rate is kept
    budget.record_memory(small, 8.0)
    assert budget.estimate(big) == 64 * 3.0
    assert budget.estimate(big, simulation=False) == 64 * 2.0
    assert not budget.fits(big, 100.0) and budget.fits(small, 12.0)


def test_no_time_limit_skips_nothing_and_a_tight_one_counts_every_candidate() -> None:
    profile = small_profile(3)
    free = search(AutoProblem(profile=profile, ranks=4))
    assert free.over_budget == 0 and free.unexamined == 0
    tight = search(AutoProblem(profile=profile, ranks=4, time_limit=1e-6))
    assert tight.considered == (tight.invalid + tight.pruned + tight.simulated
                                + tight.duplicates + tight.unexamined + tight.over_budget)


def test_under_a_time_limit_cheap_1f1b_goes_first_until_one_fits() -> None:
    """Until a candidate is ranked, 1F1B candidates from the cheapest to examine, then the
    best-bound one recomputing every stage; then the rest by bound, none given twice."""
    from dataclasses import replace

    from pipeweave.auto.search import SAFE_SCHEDULE, Keyed, _safe_first

    def entry(bound: float, schedule: str, recompute: int = 0, microbatches: int = 8) -> Keyed:
        return Keyed(bound, (), int(bound), replace(_candidate(4, 1, microbatches),
                                                    schedule=schedule, recompute=recompute))

    keyed = [entry(1, "zb-h2"), entry(2, "zb-h1"), entry(3, "1f1b", 4), entry(4, "1f1b", 0, 64),
             entry(5, "gpipe"), entry(6, "1f1b", 0, 4), entry(7, "1f1b")]
    assert SAFE_SCHEDULE == "1f1b"
    never = [e.bound for e in _safe_first(keyed, lambda: False)]
    assert never == [6, 7, 4, 3, 1, 2, 5]  # cheapest 1F1B up, recomputing one, then by bound
    given: list[float] = []
    at_once = [e.bound for e in _safe_first(keyed, lambda: len(given) >= 1)
               if not given.append(e.bound)]
    assert at_once == [6, 1, 2, 3, 4, 5, 7]  # the first seed fitted: the rest by bound
    assert [e.bound for e in _safe_first(keyed[:2], lambda: False)] == [1, 2]  # no 1F1B
