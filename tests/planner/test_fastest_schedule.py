"""``pipeweave plan --schedule fastest``: the method's split, the synchronous schedule the
simulator predicts fastest for it within the memory limit (planner/registry.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.planner import Plan, PlanRequest, make_plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.profiler import BlockProfile, Profile

# Four equal blocks, F = 1, B = 2 split I = W = 1 (the zero-bubble papers' unit costs): on
# 4 ranks with M = 8 one iteration of 1F1B takes 33, of ZB-H1 27 (issue 15's closed forms).
UNIT = Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, 1e6, 1e6, 1e6, weight_grad=1.0,
                                  input_grad=1.0) for i in range(4)),
               model="unit", source="synthetic")


def request(**kwargs: object) -> PlanRequest:
    return PlanRequest(profile=UNIT, ranks=4, microbatches=8, schedule="fastest",
                       **kwargs)  # type: ignore[arg-type]


def test_zero_bubble_wins_at_unit_costs() -> None:
    result = make_plan(request(), "uniform")
    tried = result.details["schedules"]
    assert tried["1f1b"] == pytest.approx(33.0)
    assert tried["zb-h1"] == pytest.approx(27.0)
    assert tried["zb-h2"] == pytest.approx(27.0)  # with its flush, one iteration is ZB-H1's
    assert result.plan.schedule == "zb-h1"  # the first of the fastest, in name order
    assert result.predicted_iteration_time == pytest.approx(27.0)


def _peak(schedule: str) -> float:
    """The memory model's fullest rank for the uniform split of UNIT under ``schedule``."""
    plan = Plan(num_blocks=4, stages=((0, 1), (1, 2), (2, 3), (3, 4)), schedule=schedule,
                microbatches=8)
    return max(r.total for r in predicted_memory(UNIT, plan, batch_size=8, optimizer=None))


def test_the_memory_limit_leaves_out_what_holds_more() -> None:
    """GPipe holds M = 8 micro-batches on every rank and ZB-H2 up to 2P-1 = 7, 1F1B and
    ZB-H1 at most P = 4 (the memory model, which the check asks): a limit between keeps GPipe
    and ZB-H2 out, and ZB-H1 still wins."""
    fits, holds_more = max(_peak("1f1b"), _peak("zb-h1")), min(_peak("gpipe"), _peak("zb-h2"))
    assert fits < holds_more
    result = make_plan(request(memory_limit=(fits + holds_more) / 2), "uniform")
    tried = result.details["schedules"]
    assert result.plan.schedule == "zb-h1"
    assert isinstance(tried["gpipe"], str) and "memory-limit" in tried["gpipe"]
    assert isinstance(tried["zb-h2"], str)
    assert tried["1f1b"] == pytest.approx(33.0)


def test_nothing_fits_is_one_line() -> None:
    with pytest.raises(ValueError, match="no synchronous schedule fits"):
        make_plan(request(memory_limit=1.0), "uniform")


def test_slicer_and_fastest_are_refused_together() -> None:
    with pytest.raises(ValueError, match="give one of them"):
        make_plan(request(slicer=True), "uniform")


def test_a_costly_split_keeps_1f1b(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """When I + W cost far more than B (a split that recomputes), no zero-bubble schedule is
    chosen (AutoPipe's sliced 1F1B, whose halved first micro-batches shorten the warm-up, is
    the fastest here); through the CLI (in this process: ``python -m pipeweave`` itself is
    tests/cli/test_cli.py's)."""
    costly = Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, 1e6, 1e6, 1e6, weight_grad=3.0,
                                        input_grad=3.0) for i in range(4)),
                     model="costly", source="synthetic")
    path = tmp_path / "profile.json"
    costly.save(path)
    argv = ["plan", "--profile", str(path), "--ranks", "4", "--method", "time",
            "--microbatches", "8", "--schedule", "fastest"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schedule"] == "sliced-1f1b"
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "schedule zb-h1:" in text and "(chosen)" in text
