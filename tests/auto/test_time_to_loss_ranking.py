"""``pipeweave auto --semantics any`` ranks by predicted time to a target loss: real pilots of
each finalist (``pipeweave.measure.pilot``) on a tiny GPT, and the arithmetic of
``pipeweave.auto.time_to_loss``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.time_to_loss import PilotCurve, fit_line, rank_by_time_to_loss
from pipeweave.cli.cmd_auto import format_table, report_json
from pipeweave.cli.main import main
from pipeweave.measure import pilot_finalists
from pipeweave.profiler import Profile

# A 6-block GPT (embedding, 2 x (attention, FFN), head) of width 16 on 8-token windows.
TINY = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 8}


def test_fit_line_and_a_pilot_curve() -> None:
    assert fit_line([1.0, 2.0, 3.0], [5.0, 4.0, 3.0]) == (6.0, -1.0)
    assert PilotCurve((5.0, 4.0, 3.0), 8).line() == (6.0, -1 / 8)
    assert PilotCurve((5.0, math.inf), 8).line()[1] == math.inf
    with pytest.raises(ValueError, match="--steps 2 or more"):
        fit_line([1.0], [5.0])


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    """Two finalists of a real search on 2 ranks, both 2 stages x M = 4: PipeDream (no flush)
    predicted 1.19x the samples/s of the default 1F1B plan."""
    problem = AutoProblem(profile=small_profile(3, blocks=6), ranks=2, semantics="any",
                          schedules=("1f1b", "pipedream"), methods=("uniform",))
    found = search(problem)
    stale = next(p for p in found.ranked if p.candidate.schedule == "pipedream"
                 and p.candidate.depth == 2 and p.candidate.microbatches == 4)
    assert found.default is not None
    assert stale.samples_per_second > 1.1 * found.default.samples_per_second
    return dataclasses.replace(found, ranked=(stale, found.default))


def _order(ranking) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.prediction.candidate.schedule for r in ranking.rows]


def test_a_poor_pilot_slope_moves_the_faster_plan_down(result) -> None:  # type: ignore[no-untyped-def]
    # Adam at 1e-2: PipeDream's per-micro-batch updates learn faster per sample than 1F1B's
    # (measured 2.6x on this model), so the faster plan stays first.
    good = pilot_finalists(result, model="gpt-tiny", overrides=TINY, steps=6, top=2,
                           target=None, lr=1e-2)
    assert _order(good)[0] == "pipedream"
    first = good.rows[0]
    assert first.piloted and first.relative_slope > 1.0
    # Adam at 5e-2: the stale updates overshoot (measured 0.34x 1F1B's loss per sample), and
    # the exact 1F1B plans, slower per sample/s, reach 1F1B's pilot loss first.
    poor = pilot_finalists(result, model="gpt-tiny", overrides=TINY, steps=6, top=2,
                           target=None, lr=5e-2)
    assert _order(poor)[0] == "1f1b"
    stale = next(r for r in poor.rows if r.prediction.candidate.schedule == "pipedream")
    exact = next(r for r in poor.rows if r.prediction.candidate.schedule == "1f1b")
    # What moves it down: its loss per sample against 1F1B's, times its speed, is below 1
    # (0.34 x 1.19 on torch 2.13; 0.79 x 1.19 on 2.11: a 6-step pilot at this rate is chaotic)
    speedup = stale.prediction.samples_per_second / exact.prediction.samples_per_second
    assert stale.piloted and stale.relative_slope * speedup < 1.0
    exact = next(r for r in poor.rows if r.prediction.candidate.schedule == "1f1b")
    assert not exact.piloted and exact.relative_slope == 1.0
    # the target is 1F1B's line after its pilot, and the time is samples / samples per second
    assert poor.target == pytest.approx(poor.start + poor.baseline_slope * 6 * result.problem.batch)
    assert exact.seconds == pytest.approx(exact.samples / exact.prediction.samples_per_second)


def test_the_table_and_json_say_the_ranking(result) -> None:  # type: ignore[no-untyped-def]
    ranking = pilot_finalists(result, model="gpt-tiny", overrides=TINY, steps=4, top=2,
                              target=4.0, lr=1e-2)
    assert ranking.target == 4.0
    text = format_table(result, 2, ranking)
    assert "s to target" in text.splitlines()[1] and "ranked by predicted time to loss 4.0000" in text
    report = report_json(result, 2, ranking)
    assert report["ranked_by"] == "time to loss" and report["time_to_loss"]["target_loss"] == 4.0
    timed = [row for row in report["table"] if "predicted_seconds_to_target" in row]
    assert len(timed) == 2


def test_a_never_reaching_plan_ranks_last() -> None:
    problem = AutoProblem(profile=small_profile(3, blocks=6), ranks=2, semantics="any",
                          schedules=("1f1b", "pipedream"), methods=("uniform",))
    found = search(problem)
    fast, slow = found.ranked[0], found.ranked[-1]
    ranking = rank_by_time_to_loss([(fast, PilotCurve((5.0, 5.1, 5.2), 8)), (slow, None)],
                                   baseline=PilotCurve((5.0, 4.5, 4.0), 8), target=None)
    assert [r.prediction for r in ranking.rows] == [slow, fast]
    assert ranking.rows[1].seconds is None and ranking.rows[1].samples is None


def test_target_loss_is_refused_outside_semantics_any(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.json"
    Profile(small_profile(3, blocks=6).blocks, model="gpt-tiny", batch_size=2,
            device="synthetic", source="synthetic").save(profile)
    out = ["--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "f.png")]
    assert main(["auto", "--profile", str(profile), "--ranks", "2", "--target-loss", "3",
                 *out]) == 2
    error = capsys.readouterr().err
    assert "add --semantics any or drop --target-loss" in error and len(error.splitlines()) == 1
    assert main(["auto", "--profile", str(profile), "--ranks", "2", "--semantics", "any",
                 "--target-loss", "3", *out]) == 2
    assert "give --model NAME, or drop --target-loss" in capsys.readouterr().err
    assert not (tmp_path / "plan.json").exists()


def test_without_a_model_the_table_says_it_ranks_by_samples_per_second(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.json"
    Profile(small_profile(3, blocks=6).blocks, model="gpt-tiny", batch_size=2,
            device="synthetic", source="synthetic").save(profile)
    assert main(["auto", "--profile", str(profile), "--ranks", "2", "--semantics", "any",
                 "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "f.png")]) == 0
    assert "ranked by predicted samples/s: ranking by time to loss pilots" in capsys.readouterr().out
    assert main(["auto", "--profile", str(profile), "--ranks", "2", "--semantics", "any", "--json",
                 "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "f.png")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranked_by"] == "samples per second" and report["time_to_loss"] is None
