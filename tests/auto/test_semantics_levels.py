"""``--semantics exact|averaged|any``, named by what the user keeps: the default plans train
exactly as one process would; AvgPipe's N > 1 pipelines only when averaging is allowed,
asynchronous schedules and APC only with ``any``; every row says which training it keeps and
a winner that changes the learning rule says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.axes import enumerate_candidates
from pipeweave.auto.problem import SEMANTICS, TRAINING, allows, check_settings
from pipeweave.cli.cmd_auto import format_table
from pipeweave.cli.main import main
from pipeweave.profiler import Profile
from pipeweave.schedules import get_info


def _trainings(semantics: str) -> set[str]:
    """The trainings of every candidate the search considers."""
    problem = AutoProblem(profile=small_profile(2), ranks=2, semantics=semantics,
                          pipelines=(1, 2))
    return {c.training() for c in enumerate_candidates(problem)}


def test_each_level_admits_what_it_names_and_no_more() -> None:
    assert _trainings("exact") == {"exact"}
    assert _trainings("averaged") == {"exact", "averaged"}
    assert {"exact", "averaged", "stale weights"} <= _trainings("any")


def test_the_levels_nest() -> None:
    for training in TRAINING:
        admitted = [allows(level, training) for level in SEMANTICS]
        assert admitted == sorted(admitted), training  # once admitted, admitted above too
    assert SEMANTICS[0] == "exact"


def test_exact_plans_use_only_synchronous_single_model_schedules() -> None:
    problem = AutoProblem(profile=small_profile(2), ranks=2, pipelines=(1, 2, 4))
    assert problem.semantics == "exact"
    result = search(problem)
    for p in result.ranked:
        assert get_info(p.candidate.schedule).synchronous
        assert p.candidate.pipelines == 1 and not p.candidate.apc


def test_an_averaged_winner_says_it_changes_the_learning_rule() -> None:
    problem = AutoProblem(profile=small_profile(2), ranks=2, semantics="averaged",
                          schedules=("avgpipe",), pipelines=(2,))
    result = search(problem)
    assert result.winner.candidate.training() == "averaged"
    text = format_table(result, 3)
    assert "changes the learning rule" in text and "N=2 models" in text
    assert f"{2 * problem.batch} samples per iteration" in text
    header = text.splitlines()[1]
    assert header.rstrip().endswith("training")


def test_the_json_says_the_training_of_every_row(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    profile = small_profile(11, blocks=10)
    Profile(profile.blocks, model="gpt-tiny", batch_size=4, device="synthetic",
            source="synthetic").save(tmp_path / "p.json")
    assert main(["auto", "--profile", str(tmp_path / "p.json"), "--ranks", "2", "--json",
                 "--semantics", "any", "--out", str(tmp_path / "plan.json"),
                 "--plot", str(tmp_path / "f.png")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["semantics"] == "any"
    for row in [*report["table"], report["winner"], report["default"]]:
        assert row["training"] in TRAINING
    assert report["default"]["training"] == "exact"


def test_an_old_or_unknown_level_is_one_line() -> None:
    with pytest.raises(ValueError, match="exact .same updates as one process.*averaged.*any"):
        check_settings(ranks=2, semantics="sync")
