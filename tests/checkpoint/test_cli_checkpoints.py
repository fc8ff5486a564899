"""``pipeweave train --checkpoint-every/--checkpoint-dir/--resume`` (in-process, one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main

COMMON = ["train", "--model", "mlp", "--executor", "local", "--batch-size", "16",
          "--dtype", "float64", "--no-progress"]


def _losses(directory: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_train_checkpoint_then_resume_under_another_plan(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMMON, "--steps", "6", "--output-dir", str(tmp_path / "straight")]) == 0
    assert main([*COMMON, "--steps", "3", "--checkpoint-every", "2",
                 "--output-dir", str(tmp_path / "first")]) == 0
    checkpoints = tmp_path / "first" / "checkpoints"  # the default under --output-dir
    assert sorted(p.name.split("-")[1] for p in checkpoints.glob("step-*")) == ["00000002",
                                                                               "00000003"]
    capsys.readouterr()
    assert main([*COMMON, "--steps", "6", "--stages", "4", "--schedule", "gpipe",
                 "--resume", str(checkpoints), "--output-dir", str(tmp_path / "second")]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "after step 3 of 6" in out
    # Steps 1-3 come from the checkpoint, 4-6 were computed by 4 stages: all equal the straight run.
    assert _losses(tmp_path / "second") == _losses(tmp_path / "straight")
    rows = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    assert ["time_s" in row for row in rows] == [False, False, False, True, True, True]
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert summary["first_step"] == 3 and summary["steps"] == 6
    # The CSV's columns are those of a fresh run, in the same order, restored steps or not.
    header = (tmp_path / "second" / "metrics.csv").read_text().splitlines()[0]
    assert header == (tmp_path / "straight" / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("step,loss,time_s,samples")


def test_train_resume_auto_starts_fresh_then_continues(tmp_path: Path) -> None:
    args = [*COMMON, "--checkpoint-every", "1", "--checkpoint-dir", str(tmp_path / "ck"),
            "--resume", "auto", "--output-dir", str(tmp_path / "out")]
    assert main([*args, "--steps", "2"]) == 0  # nothing to resume: starts at step 0
    assert main([*args, "--steps", "4"]) == 0  # continues after step 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_step"] == 2 and len(summary["losses"]) == 4


@pytest.mark.parametrize(("extra", "message"), [
    (["--resume", "/nonexistent/ckpt"], "checkpoint /nonexistent/ckpt does not exist"),
    (["--schedule", "pipedream", "--checkpoint-every", "1", "--option", "drain=2"],
     "a checkpoint after step 1 needs a drain there, but 'pipedream' drains every 2 steps"),
    (["--resume", "auto"], "pass --checkpoint-dir DIR with --resume auto"),
])
def test_train_checkpoint_errors_are_one_line(extra: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMMON, "--steps", "2", "--output-dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: ") and message in err


@pytest.mark.parametrize("microbatches", ["2", "8"])
def test_resume_with_another_microbatch_count_records_the_right_losses(
        microbatches: str, tmp_path: Path) -> None:
    """The batch is the same whatever M, so the losses of a run resumed with another M equal
    the uninterrupted run's (restored ones included) in metrics, summary and history."""
    assert main([*COMMON, "--steps", "6", "--output-dir", str(tmp_path / "straight")]) == 0
    assert main([*COMMON, "--steps", "3", "--checkpoint-every", "3",
                 "--output-dir", str(tmp_path / "first")]) == 0
    assert main([*COMMON, "--steps", "6", "--microbatches", microbatches, "--checkpoint-every",
                 "2", "--resume", str(tmp_path / "first"),
                 "--output-dir", str(tmp_path / "second")]) == 0
    straight = _losses(tmp_path / "straight")
    assert _losses(tmp_path / "second") == pytest.approx(straight, rel=1e-9)
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert summary["losses"] == pytest.approx(straight, rel=1e-9)
    assert summary["microbatches"] == int(microbatches)
    # The resumed run's own checkpoint carries the history on under the new M.
    assert main([*COMMON, "--steps", "8", "--resume", str(tmp_path / "second"),
                 "--output-dir", str(tmp_path / "third")]) == 0
    assert _losses(tmp_path / "third")[:6] == pytest.approx(straight, rel=1e-9)
