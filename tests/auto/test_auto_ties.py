"""``auto`` with a tied parameter (first and last block share it, like GPT-2's wte/lm_head):
candidates whose schedule the runtime refuses for that split are invalid, with the reason in
the table and JSON; the others pay for the copies' gradient sum."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.predict import candidate_costs, candidate_plan
from pipeweave.auto.problem import Candidate
from pipeweave.cli.cmd_auto import format_table, report_json
from pipeweave.profiler import LinkProfile, Profile, TieProfile

REFUSED = {"pipedream", "wpipe", "pipeoptim", "spectrain"}
"""What docs/auto.md and runtime/execution/ties.py say the runtime refuses for a tie split
over stages (different weight versions per stage, or predicted weights)."""
TIED = 4e5


def _tied_profile() -> Profile:
    profile = small_profile(0, blocks=6, link=LinkProfile(1e9, 1e-5))
    return replace(profile, ties=(TieProfile((0, 5), TIED, ("0.w", "5.w")),))


def test_refused_schedules_are_invalid_and_never_proposed() -> None:
    problem = AutoProblem(profile=_tied_profile(), ranks=2, semantics="any",
                          methods=("uniform",))
    result = search(problem)
    assert result.refused_ties > 0
    assert result.tie_reason is not None and "0.w and 5.w" in result.tie_reason
    for p in (*result.ranked, *result.over_limit):
        split = len({s for s, (a, e) in enumerate(p.plan.stages) for b in (0, 5) if a <= b < e})
        assert split == 1 or p.candidate.schedule not in REFUSED, p.candidate
    proposed = {p.candidate.schedule for p in result.ranked if len(p.plan.stages) > 1}
    assert proposed & REFUSED == set()
    assert "2bw" in proposed  # 2BW keeps a tie exact: not refused
    assert any("split a tied parameter" in line and "candidates considered" in line
               for line in format_table(result, 5).splitlines())
    assert report_json(result, 5)["invalid_ties"] == result.refused_ties
    untied = search(replace(problem, profile=replace(problem.profile, ties=())))
    assert untied.refused_ties == 0
    assert untied.invalid + result.refused_ties == result.invalid


def test_a_split_tie_is_priced_on_both_holders_updates() -> None:
    profile = _tied_profile()
    problem = AutoProblem(profile=profile, ranks=2)
    candidate = Candidate(schedule="1f1b", method="uniform", depth=2, width=1, chunks=1,
                          pipelines=1, microbatches=4, recompute=0, apc=False,
                          bounds=((0, 3), (3, 6)))
    plan = candidate_plan(candidate, problem)
    tied = candidate_costs(candidate, plan, profile, problem).resolve(2).update
    untied = candidate_costs(candidate, plan, replace(profile, ties=()), problem).resolve(2).update
    message = 1e-5 + TIED / 1e9  # the profile's link between the two ranks
    assert [t - u for t, u in zip(tied, untied)] == pytest.approx([message, message])
