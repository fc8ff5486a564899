"""``benchmarks/auto_predict.py --two-profiles`` plumbing, with a fake search and fake runs:
two searches, both winners measured in alternating rounds, the slower over the faster.
No process runs; no timed assertion."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import auto_predict  # noqa: E402

from pipeweave.planner.plan import Plan  # noqa: E402


def _report(microbatches: int, predicted: float) -> dict[str, Any]:
    plan = Plan(num_blocks=4, stages=((0, 2), (2, 4)), schedule="1f1b", microbatches=microbatches)
    return {"batch_size": 16, "winner": {
        "schedule": "1f1b", "method": "uniform", "stages": [[0, 2], [2, 4]], "replicas": None,
        "microbatches": microbatches, "pipelines": 1, "apc": False, "training": "exact",
        "predicted_iteration_time": predicted, "predicted_samples_per_second": 16 / predicted,
        "plan": plan.to_json()}}


@pytest.mark.parametrize("times, ratio, within", [((0.02, 0.021), 0.02 / 0.021, True),
                                                  ((0.02, 0.03), 0.02 / 0.03, False)])
def test_two_searches_then_both_winners_alternate(times: tuple[float, float], ratio: float,
                                                  within: bool) -> None:
    searches = iter([{"report": _report(4, 0.019), "wall_s": 1.0},
                     {"report": _report(8, 0.018), "wall_s": 2.0}])
    seen: list[tuple[str, int]] = []

    def time_one(label: str, plan: Plan, steps: int) -> float:
        seen.append((label, plan.microbatches))
        return times[0] if label == "profile 1" else times[1]

    out = auto_predict.two_profiles("toy", 2, rounds=3, seconds=0.1,
                                    search=lambda model, ranks: next(searches), time_one=time_one)
    assert seen == [("profile 1", 4), ("profile 2", 8), ("profile 2", 8), ("profile 1", 4),
                    ("profile 1", 4), ("profile 2", 8)]
    assert out["ratio"] == pytest.approx(ratio) and out["within_5_percent"] is within
    assert out["same_plan"] is False
    first = out["winners"]["profile 1"]
    assert first["samples_per_second"] == pytest.approx(16 / times[0])
    assert first["predicted_samples_per_second"] == pytest.approx(16 / 0.019)
    assert [s["wall_s"] for s in out["searches"]] == [1.0, 2.0]
    assert "slower / faster measured" in auto_predict.pair_table({"toy:2": out})


def test_the_same_plan_twice_is_within_by_construction() -> None:
    from pipeweave.measure import Rounds

    reports = {"profile 1": _report(4, 0.02), "profile 2": _report(4, 0.021)}
    measured = {"profile 1": Rounds((0.02,), 10), "profile 2": Rounds((0.04,), 10)}
    out = auto_predict.profile_pair(reports, measured)
    assert out["same_plan"] is True and out["within_5_percent"] is True
    assert out["ratio"] == pytest.approx(0.5)
