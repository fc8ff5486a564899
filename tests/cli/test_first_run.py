"""A new user's first commands (issue 13, items 1-4): every schedule trains with its defaults,
--version and defaults in --help, papers cited as papers, --plan beside split flags refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave import __version__
from pipeweave.cli.main import main
from pipeweave.runtime import Plan
from pipeweave.schedules import available_schedules


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", [info.name for info in available_schedules()])
def test_every_schedule_trains_with_default_options(schedule: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--schedule", schedule, "--steps", "2", "--no-progress",
                 "--output-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"schedule {schedule}" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["losses"]) == 2
    plan = Plan.load(tmp_path / "plan.json")
    if schedule in ("interleaved-1f1b", "wpipe"):
        assert plan.chunks == 2  # the schedule's natural chunks, not a silent 1f1b


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pipeweave {__version__}"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "learning rate (default: 0.001)" in out
    assert "default 1f1b)" in out and "(default: None)" not in out


def test_schedules_cite_papers_not_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedules"]) == 0
    out = capsys.readouterr().out
    assert ".txt" not in out
    assert "SOSP 2019" in out and "ICLR 2022" in out and "arXiv:2312.00839" in out


@pytest.mark.parametrize("flag", [["--schedule", "gpipe"], ["--stages", "3"], ["--chunks", "2"],
                                  ["--microbatches", "8"], ["--option", "sliced=1"],
                                  ["--recompute"]])
def test_plan_beside_split_flags_is_refused(flag: list[str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    Plan.uniform(10, 2).save(plan)
    assert main(["train", "--plan", str(plan), *flag, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: --plan") and flag[0] in err and "drop it" in err


def test_missing_plan_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--plan", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_spectrain_defaults_to_sgd_with_momentum(tmp_path: Path) -> None:
    from pipeweave.cli.cmd_train import optimizer_for
    from pipeweave.cli.main import build_parser

    args = build_parser().parse_args(["train", "--schedule", "spectrain"])
    optimizer = optimizer_for(args, ("sgd", {"momentum": 0.9}))
    assert optimizer.name == "sgd" and optimizer.kwargs == {"lr": 1e-3, "momentum": 0.9}
    args = build_parser().parse_args(["train", "--schedule", "spectrain", "--momentum", "0.5"])
    assert optimizer_for(args, ("sgd", {"momentum": 0.9})).kwargs["momentum"] == 0.5


@pytest.mark.parametrize(("argv", "match"), [
    (["--lr", "nan"], "lr=nan is not finite"),
    (["--lr", "inf"], "lr=inf is not finite"),
    (["--optimizer", "sgd", "--lr", "-1"], "Invalid learning rate: -1.0"),
    (["--optimizer", "sgd", "--momentum", "-0.5"], "Invalid momentum value"),
])
def test_bad_optimizer_values_stop_before_launch(argv: list[str], match: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *argv, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_chunks_the_schedule_cannot_take_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--schedule", "wpipe", "--chunks", "1", "--steps", "1",
                 "--executor", "local"]) == 2
    err = capsys.readouterr().err
    assert "use --chunks 2" in err and "Traceback" not in err and len(err.splitlines()) == 1
