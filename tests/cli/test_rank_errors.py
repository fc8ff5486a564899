"""Errors from inside a rank reach the user as one line with the fix; the traceback goes to
error.log in the output folder (issue 13, items 9 and 10)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.runtime.execution.interpreter import RankInterpreter

TINY = ["train", "--model", "mlp", "--batch-size", "16", "--no-progress", "--steps", "3"]


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("debug", [False, True])
def test_a_diverging_loss_in_a_rank_is_one_line_and_a_log(debug: bool, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*TINY, "--optimizer", "sgd", "--lr", "1e30", "--output-dir", str(tmp_path),
                 *(["--debug"] if debug else [])])
    err = capsys.readouterr().err
    assert code == 1
    headline = [line for line in err.splitlines() if line.startswith("pipeweave: error: ")]
    assert len(headline) == 1
    assert "rank 1: loss became" in headline[0] and "lower the learning rate" in headline[0]
    assert f"traceback in {tmp_path / 'error.log'}" in headline[0]
    log = (tmp_path / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "FloatingPointError" in log
    assert ("Traceback" in err) is debug


def test_in_process_executor_reports_the_same_way(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*TINY, "--executor", "local", "--optimizer", "sgd", "--lr", "1e30",
                 "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    first, *rest = err.splitlines()
    assert first.startswith("pipeweave: error: loss became") and "lower the learning rate" in first
    assert rest == [f"kept the 1 completed step in {tmp_path}/ (summary.json says failed)"]
    assert "FloatingPointError" in (tmp_path / "error.log").read_text()


@pytest.mark.parametrize("flag", ["--output-dir", "--checkpoint-dir", "--json-out"])
def test_an_unwritable_output_is_refused_before_training(flag: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / ("out.json" if flag == "--json-out" else "sub")
    args = [*TINY, "--executor", "local", flag, str(target)]
    if flag != "--output-dir":
        args += ["--output-dir", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: ") and "cannot be written" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out" / "summary.json").exists()  # refused before training


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_failed_run_keeps_the_steps_it_completed(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Iteration 1 completes at finite loss; the loss of iteration 2 diverges in rank 1."""
    code = main([*TINY, "--optimizer", "sgd", "--lr", "1e30", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "kept the 1 completed step in" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "loss became" in summary["error"]
    assert summary["steps"] == 1 and len(summary["losses"]) == 1
    assert math.isfinite(summary["losses"][0])
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
    assert (tmp_path / "trace.json").exists() and (tmp_path / "loss.png").exists()


def test_ctrl_c_keeps_the_completed_steps_and_says_how_to_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    steps = {"taken": 0}
    real = RankInterpreter._step

    def interrupt_at_the_fifth_update(self, action, position):  # type: ignore[no-untyped-def]
        steps["taken"] += 1
        if steps["taken"] == 5:  # 2 stages: updates 1-4 are steps 1 and 2, 5 is step 3's
            raise KeyboardInterrupt
        real(self, action, position)

    monkeypatch.setattr(RankInterpreter, "_step", interrupt_at_the_fifth_update)
    code = main([*TINY, "--steps", "4", "--executor", "local", "--checkpoint-every", "1",
                 "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 130
    # The interrupted update belongs to step 3, whose losses were all computed: 3 steps kept.
    assert "interrupted (Ctrl-C)" in err and "kept the 3 completed steps" in err
    assert f"--resume {tmp_path / 'checkpoints'} --steps 4" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 3


@pytest.mark.parametrize(("change", "message"), [
    (["--optimizer", "sgd"], "was written with optimizer Adam; this run uses SGD"),
    (["--batch-size", "32"], "was written with the data stream"),
])
def test_resuming_with_another_optimizer_or_batch_is_refused_before_launch(
        change: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--executor", "local", "--checkpoint-every", "1",
                 "--output-dir", str(tmp_path / "first")]) == 0
    capsys.readouterr()
    code = main([*TINY, "--steps", "4", "--resume", str(tmp_path / "first"), *change,
                 "--output-dir", str(tmp_path / "second")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pipeweave: error: checkpoint ") and message in err
    assert err.count("\n") == 1 and "rank" not in err.split(":")[1]  # before any rank started
