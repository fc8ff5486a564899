"""A newly registered schedule joins the search with no code in the search."""

from __future__ import annotations

from collections import Counter

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates, search
from pipeweave.ir import Schedule
from pipeweave.schedules import Shape, get_info, registry


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    """``toy-flush``: 1F1B's actions under a new name, registered for this test only."""
    get_info("1f1b")  # load the built-ins first
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def toy_flush(shape: Shape) -> Schedule:
        return get_info("1f1b").generate(shape)

    registry.register("toy-flush", description="test toy", paper="none",
                      synchronous=True)(toy_flush)
    return "toy-flush"


def test_a_registered_schedule_is_searched_on_every_axis(toy: str) -> None:
    problem = AutoProblem(profile=small_profile(3), ranks=4, methods=("uniform", "time"))
    per_schedule = Counter(c.schedule for c in enumerate_candidates(problem))
    assert per_schedule[toy] == per_schedule["1f1b"] > 0
    result = search(AutoProblem(profile=small_profile(3), ranks=4, schedules=(toy, "gpipe")))
    assert result.winner.candidate.schedule == toy
    assert result.winner.plan.schedule == toy


def test_an_asynchronous_one_only_with_semantics_any(monkeypatch: pytest.MonkeyPatch) -> None:
    get_info("1f1b")
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("toy-async", description="test toy", paper="none",
                      synchronous=False)(get_info("pipedream").generate)
    sync = AutoProblem(profile=small_profile(3), ranks=2)
    assert "toy-async" not in {c.schedule for c in enumerate_candidates(sync)}
    anything = AutoProblem(profile=small_profile(3), ranks=2, semantics="any")
    assert "toy-async" in {c.schedule for c in enumerate_candidates(anything)}
