"""``pipeweave train --schedule avgpipe``: flags, the checks made before any process starts,
what the run records, and one short real run on two ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli import cmd_train
from pipeweave.cli.main import main

BASE = ["train", "--model", "gpt-tiny", "--seq-len", "16", "--batch-size", "8",
        "--microbatches", "4", "--steps", "6", "--no-progress"]


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to start ranks fails the test: errors must come first."""
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a run was started")
    monkeypatch.setattr(cmd_train, "launch_local", refuse)
    monkeypatch.setattr(cmd_train, "run_local", refuse)
    monkeypatch.setattr(cmd_train, "run_under_torchrun", refuse)


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "avgpipe", "--alpha", "1.5"],
     "--alpha 1.5 is outside [0, 1]"),
    (["--schedule", "avgpipe", "--pipelines", "2", "--alpha", "-0.1"],
     "leave it out for the paper's 1/N = 0.5"),
    (["--schedule", "avgpipe", "--alpha", "nan"], "--alpha nan is outside [0, 1]"),
    (["--pipelines", "2"],
     "--pipelines 2: AvgPipe flag (N parallel pipelines with elastic averaging, advance forward "
     "propagation), but the schedule is '1f1b'; add --schedule avgpipe, or drop it"),
    (["--schedule", "gpipe", "--pipelines", "2", "--alpha", "0.5"],
     "--pipelines 2, --alpha 0.5: AvgPipe flags"),
    (["--advance", "auto"], "the schedule is '1f1b'; add --schedule avgpipe"),
    (["--schedule", "avgpipe", "--pipelines", "0"], "--pipelines 0 must be >= 1"),
    (["--schedule", "avgpipe", "--advance", "soon"],
     "--advance 'soon' must be 'auto', 'all' or an integer >= 0 (0 = 1F1B, 3 = AFAB"),
    (["--schedule", "avgpipe", "--advance", "1", "--option", "advance=2"],
     "--advance 1 and --option advance=2 both set the advance"),
    (["--schedule", "avgpipe", "--pipelines", "2", "--memory-limit", "100KB"],
     "--memory-limit 100000 B is below what rank"),
    (["--schedule", "avgpipe", "--memory-limit", "lots"], "--memory-limit 'lots' is not a size"),
    (["--schedule", "avgpipe", "--pipelines", "2", "--ranks", "4"],
     "--ranks is 4 but the plan needs 2 ranks (--stages 2). AvgPipe's N=2 parallel pipelines "
     "share the same ranks"),
    (["--schedule", "avgpipe", "--stages", "2", "--width", "2", "--ranks", "2"],
     "--ranks is 2 but the plan needs 4 ranks (--stages 2 x --width 2). Either give --ranks 4"),
])
def test_misuse_is_a_clear_error_before_any_process(
        capsys: pytest.CaptureFixture[str], no_launch: None, argv: list[str], message: str) -> None:
    assert main(BASE + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: ") and message in err, err
    assert "Traceback" not in err


def test_memory_limit_error_names_the_bytes_and_the_fix(capsys: pytest.CaptureFixture[str],
                                                        no_launch: None) -> None:
    assert main(BASE + ["--schedule", "avgpipe", "--pipelines", "3", "--memory-limit", "1MB"]) == 2
    err = capsys.readouterr().err
    assert "of parameters, gradients and optimizer state for N=3 parallel pipelines plus the " \
           "reference model; give --memory-limit above" in err
    assert "or use fewer --pipelines or more --stages" in err


def test_ranks_against_torchrun_and_gpus(capsys: pytest.CaptureFixture[str], no_launch: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(BASE + ["--schedule", "avgpipe", "--device", "cuda"]) == 2
    assert "--device cuda was asked but torch sees no CUDA device" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert main(BASE + ["--schedule", "avgpipe", "--pipelines", "2"]) == 2
    err = capsys.readouterr().err
    assert "torchrun's WORLD_SIZE is 4 but the plan needs 2 ranks" in err
    assert "start 2 processes (torchrun --nproc-per-node 2)" in err
    assert main(BASE + ["--schedule", "avgpipe", "--ranks", "2"]) == 2
    assert "--ranks 2 but torchrun started 4 processes" in capsys.readouterr().err


def test_flags_reach_the_plan_and_the_job() -> None:
    parser = cmd_train.argparse.ArgumentParser()
    cmd_train.add_parser(parser.add_subparsers())
    args = parser.parse_args(BASE + ["--schedule", "avgpipe", "--pipelines", "3",
                                         "--alpha", "0.25", "--advance", "all"])
    job = cmd_train.build_job(args)
    assert job.plan.pipelines == 3 and job.plan.semantics.alpha == 0.25
    assert job.plan.schedule_options["advance"] == 3 and job.advance is None
    args = parser.parse_args(BASE + ["--schedule", "avgpipe", "--pipelines", "2",
                                         "--advance", "auto", "--memory-limit", "64MB"])
    job = cmd_train.build_job(args)
    assert job.advance is not None and job.advance.memory_limit == 64e6
    assert "advance" not in job.plan.schedule_options


def test_local_run_records_the_advance_and_the_limit(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(BASE + ["--schedule", "avgpipe", "--pipelines", "2", "--advance", "auto",
                        "--memory-limit", "64MB", "--executor", "local", "--output-dir",
                        str(out), "--json-out", str(tmp_path / "s.json")]) == 0
    printed = capsys.readouterr().out
    assert "advance  0 (steps 1-" in printed and "memory limit (MiB)" in printed
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["memory_limit"] == 64e6 and len(summary["advance_per_step"]) == 6
    assert summary["advance_per_step"][:2] == [0, 0]        # warm-up, then the first sample
    log = summary["advance_log"]
    assert log[0]["decision"] == "warmup" and all(e["peak_bytes"] <= 64e6 for e in log)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["advance"] for r in rows] == summary["advance_per_step"]
    assert rows[0]["activation_bytes"] > 0 and rows[0]["decision"] == "warmup"
    # a fixed advance is recorded too
    assert main(BASE + ["--schedule", "avgpipe", "--advance", "all", "--executor", "local",
                        "--output-dir", str(out), "--json-out", str(tmp_path / "f.json")]) == 0
    fixed = json.loads((tmp_path / "f.json").read_text())
    assert fixed["advance_per_step"] == [3] * 6 and fixed["memory_limit"] is None


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_two_real_ranks_with_two_pipelines(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE + ["--schedule", "avgpipe", "--pipelines", "2", "--alpha", "0.5",
                        "--advance", "auto", "--memory-limit", "1GB", "--ranks", "2",
                        "--timeout", "60", "--output-dir", str(tmp_path / "run"),
                        "--json-out", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["world_size"] == 2 and len(summary["losses"]) == 6
    assert len(summary["advance_per_step"]) == 6 and summary["advance_per_step"][0] == 0
    assert summary["advance_log"] and summary["memory_limit"] == 1e9
