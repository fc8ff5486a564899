"""The search freezes what is live after each candidate it examines and leaves nothing frozen
when it returns (``collector.frozen_between``): the collector then scans only what a candidate
allocates, and the search's answer is the one it gives with plain collection."""

from __future__ import annotations

import gc

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search


def test_the_search_freezes_between_candidates_and_unfreezes(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    problem = AutoProblem(profile=small_profile(3), ranks=4, methods=("uniform", "time"))
    plain = search(problem)
    freezes = []
    monkeypatch.setattr(gc, "freeze", lambda real=gc.freeze: (freezes.append(1), real())[1])
    frozen = search(problem)
    assert len(freezes) >= frozen.considered - frozen.invalid - 1
    assert gc.get_freeze_count() == 0
    assert [p.samples_per_second for p in frozen.ranked] == \
        [p.samples_per_second for p in plain.ranked]
    assert frozen.winner.candidate == plain.winner.candidate
