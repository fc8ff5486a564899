"""``pipeweave tune``: the predicted table, the chosen (M, N), traversal, misuse."""

from __future__ import annotations

import json

import pytest

from pipeweave.cli.cmd_tune import default_profile_at, parse_grid
from pipeweave.cli.main import main

BASE = ["tune", "--model", "cnn", "--stages", "2", "--batch-size", "8",
        "--microbatches-grid", "1,2,4", "--pipelines-grid", "1,2"]


def test_prints_the_predicted_table_and_the_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE + ["--memory-limit", "10MB"]) == 0
    out = capsys.readouterr().out
    assert "profiled M=4, N=1 (simulate); memory limit 10.000 MB" in out
    assert "pred ms/batch" in out and "chosen (M, N) = (" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"], ["4"])]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]


def test_json_and_traversal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE + ["--mode", "traverse", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profile_at"] == [4, 1] and len(report["predictions"]) == 6
    assert tuple(report["chosen"]) in {(p["M"], p["N"]) for p in report["predictions"]}
    traversal = report["traversal"]
    assert len(traversal["measurements"]) == 6 and traversal["best"] is not None
    assert traversal["pick_vs_best"] >= 1.0
    # the profile is the record the tuner used, one rank per stage
    assert report["profile"]["microbatches"] == 4 and len(report["profile"]["ranks"]) == 2


def test_misuse_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE + ["--memory-limit", "1000"]) == 2
    assert "below the model size" in capsys.readouterr().err
    assert main(BASE[:-4] + ["--microbatches-grid", "3", "--pipelines-grid", "1"]) == 2
    assert "do not divide the batch size 8" in capsys.readouterr().err
    assert main(BASE + ["--profile-at", "3,1"]) == 2
    assert "--profile-at" in capsys.readouterr().err


def test_grid_parsing_and_default_profiling_point() -> None:
    assert parse_grid("--x", "8,2,4,2") == [2, 4, 8]
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_grid("--x", "2,a")
    assert default_profile_at([1, 2, 4, 8], [1, 2]) == (8, 1)
    assert default_profile_at([4], [2, 3]) == (4, 2)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_measure_profiles_one_real_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--model", "gpt-tiny", "--stages", "2", "--batch-size", "4",
                 "--microbatches-grid", "1,2", "--pipelines-grid", "1,2", "--source", "measure",
                 "--utilisation", "busy", "--iterations", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "measure" and report["profile"]["source"] == "measured"
    assert report["profile"]["microbatches"] == 2 and len(report["predictions"]) == 4
    assert report["tuning_s"] > 0 and report["chosen"] is not None


def test_real_run_iterations_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE + ["--source", "measure", "--iterations", "0"]) == 2
    assert "--iterations 0 must be >= 1" in capsys.readouterr().err
