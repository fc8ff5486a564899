"""``pipeweave auto --why``: an iteration split into compute, updates, bubble and
communication, checked against closed forms, and the CLI's table, JSON and timelines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auto_fixtures import small_profile
from pipeweave.auto.why import split_iteration
from pipeweave.cli.main import main
from pipeweave.profiler import Profile
from pipeweave.schedules import Shape, build_schedule
from pipeweave.sim import Costs, simulate


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8)])
def test_1f1b_splits_into_the_closed_form(stages: int, microbatches: int) -> None:
    """1F1B, F = 1, B = 2, an update u, free transfers: an iteration is (M + P - 1)(F + B) + u;
    the busiest rank computes M (F + B) of it and waits (P - 1)(F + B) (fill and drain)."""
    schedule = build_schedule("1f1b", Shape(stages=stages, microbatches=microbatches,
                                            iterations=4))
    free = simulate(schedule, Costs(forward=1.0, backward=2.0, update=0.5))
    compute, updates, bubble, communication = split_iteration(free, free)
    assert (compute, updates, communication) == pytest.approx((microbatches * 3.0, 0.5, 0.0))
    assert bubble == pytest.approx((stages - 1) * 3.0)
    assert free.iteration_time == pytest.approx((microbatches + stages - 1) * 3.0 + 0.5)


@pytest.mark.parametrize("stages", [2, 4])
def test_one_microbatch_pays_every_transfer(stages: int) -> None:
    """M = 1: the iteration is one chain F_0 .. F_{P-1} B_{P-1} .. B_0, crossing 2 (P - 1)
    boundaries of transfer time c: communication 2 (P - 1) c, bubble (P - 1)(F + B)."""
    schedule = build_schedule("1f1b", Shape(stages=stages, microbatches=1, iterations=4))
    costs = Costs(forward=1.0, backward=2.0, update=0.5)
    free = simulate(schedule, costs)
    timed = simulate(schedule, Costs(forward=1.0, backward=2.0, update=0.5, comm=0.25))
    compute, updates, bubble, communication = split_iteration(timed, free)
    assert communication == pytest.approx(2 * (stages - 1) * 0.25)
    assert (compute, updates, bubble) == pytest.approx((3.0, 0.5, (stages - 1) * 3.0))
    assert compute + updates + bubble + communication == pytest.approx(timed.iteration_time)


def test_the_cli_explains_the_winner_against_the_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = small_profile(11, blocks=10)
    Profile(profile.blocks, model="gpt-tiny", batch_size=4, device="synthetic",
            source="synthetic").save(tmp_path / "profile.json")
    argv = ["auto", "--profile", str(tmp_path / "profile.json"), "--ranks", "2", "--why",
            "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "front.png")]
    assert main([*argv, "--json"]) == 0
    why = json.loads(capsys.readouterr().out)["why"]
    rows = {row["label"]: row for row in why["breakdown"]}
    assert set(rows) == {"winner", "default"}
    for row in rows.values():
        parts = row["compute"] + row["updates"] + row["bubble"] + row["communication"]
        assert parts == pytest.approx(row["iteration_time"], rel=1e-9)
    for label, path in why["timelines"].items():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", label
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "bubble" in out and "of the gain" in out and "winner timeline:" in out


@pytest.mark.parametrize("microbatches", [1, 2, 8])
def test_the_breakdown_prices_the_winner_at_its_own_microbatch(microbatches: int) -> None:
    """A winner whose micro-batch is not the profile's (batch 16, M = 1, 2, 8, profiled at 2
    samples): the breakdown simulates the profile scaled to the winner's micro-batch, as its
    prediction did, so its iteration is the prediction's (the unscaled profile gave 1/8..1x)."""
    from pipeweave.auto import AutoProblem, search
    from pipeweave.auto.why import breakdown

    problem = AutoProblem(profile=small_profile(5, blocks=6), ranks=2, batch_size=16,
                          microbatches=(microbatches,), schedules=("1f1b", "gpipe"))
    winner = search(problem).winner
    assert winner.plan.microbatches == microbatches
    row, simulated = breakdown(winner, problem, label="winner")
    assert row.iteration_time == pytest.approx(winner.iteration_time, rel=1e-9)
    assert simulated.iteration_time == pytest.approx(winner.iteration_time, rel=1e-9)
