"""A refused command leaves nothing behind and refuses before it works (issue 24, items 3
and 5): ``pipeweave train`` creates its run folder and moves ``runs/latest`` only after every
check; commands check their arguments before profiling; a file argument that cannot be read
is named in one line with the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeweave.cli import cmd_train
from pipeweave.cli.main import main

TRAIN = ["train", "--model", "mlp", "--batch-size", "16", "--steps", "1", "--no-progress",
         "--executor", "local"]


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder beside the working folder, for the inputs the refusals need: a file where a
    folder should be, a damaged checkpoint."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "a-file").write_text("not a folder")
    step = folder / "damaged" / "step-00000002-0badc0de"
    step.mkdir(parents=True)
    (step / "MANIFEST.json").write_text("{not json")
    (folder / "damaged" / "latest").write_text(step.name + "\n")
    return folder


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_line(err: str) -> str:
    assert err.startswith("pipeweave: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


REFUSALS = {
    "batch not divisible": ["--batch-size", "3", "--microbatches", "4"],
    "missing checkpoint": ["--resume", "/nonexistent"],
    "damaged checkpoint": ["--resume", "{outside}/damaged"],
    "checkpoint off a drain": ["--schedule", "pipedream", "--steps", "4",
                               "--checkpoint-every", "1", "--option", "drain=2"],
    "unwritable checkpoint dir": ["--checkpoint-dir", "{outside}/a-file/sub"],
    "unwritable json-out": ["--json-out", "{outside}/a-file/summary.json"],
    "cuda without GPUs": ["--device", "cuda", "--executor", "processes"],
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_refused_train_leaves_the_folder_empty(name: str, outside: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if name == "cuda without GPUs" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs the plan needs")
    monkeypatch.chdir(tmp_path)
    argv = [a.format(outside=outside) for a in REFUSALS[name]]
    assert main([*TRAIN, *argv]) == 2
    _one_line(capsys.readouterr().err)
    assert _tree(tmp_path) == []  # no runs/, no runs/<date>-..., no checkpoints/


def test_a_refusal_puts_runs_latest_back(outside: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The run folder is made and the link moved, then --checkpoint-dir is refused: both are
    undone, and the earlier run's folder and link are as they were."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "earlier").mkdir(parents=True)
    (tmp_path / "runs" / "latest").symlink_to("earlier", target_is_directory=True)
    before = _tree(tmp_path)
    assert main([*TRAIN, "--checkpoint-dir", str(outside / "a-file" / "sub")]) == 2
    assert _tree(tmp_path) == before
    assert os.readlink(tmp_path / "runs" / "latest") == "earlier"


def test_a_refusal_while_the_ranks_start_removes_the_new_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ValueError can only come from the executor after the folder exists: it is removed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "earlier").mkdir(parents=True)
    (tmp_path / "runs" / "latest").symlink_to("earlier", target_is_directory=True)
    before = _tree(tmp_path)

    def refuse(ready: Any) -> Any:
        assert (tmp_path / "runs" / "latest").resolve() != (tmp_path / "runs" / "earlier")
        raise ValueError("refused late")

    monkeypatch.setattr(cmd_train, "run_local", refuse)
    assert main([*TRAIN, "--checkpoint-every", "1"]) == 2
    assert "refused late" in _one_line(capsys.readouterr().err)
    assert _tree(tmp_path) == before
    assert os.readlink(tmp_path / "runs" / "latest") == "earlier"


def _no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling, calibrating or launching anything fails the test: the refusal must come
    first."""
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("profiled or launched before the arguments were checked")

    import pipeweave.measure as measure
    from pipeweave.cli import cmd_profile, cmd_tune
    from pipeweave.measure import calibration
    from pipeweave.profiler import measure as profiler_measure

    # cmd_auto and measure.profiles import what measures where it measures (no torch to plan)
    for module, name in ((profiler_measure, "profile_builtin_sizes"), (cmd_profile, "profile_builtin"),
                         (calibration, "calibrate"), (cmd_profile, "calibrate"),
                         (cmd_profile, "measure_link"), (cmd_tune, "tuning_profile"),
                         (cmd_tune, "builtin_model"), (measure, "calibrate"),
                         (measure, "fit_calibration"), (measure, "profile_sizes")):
        monkeypatch.setattr(module, name, forbidden)


EARLY = {
    "auto --ranks 0": (["auto", "--model", "gpt-tiny", "--ranks", "0"], "--ranks"),
    "auto without a model": (["auto", "--ranks", "0"], "--model"),
    "auto --topology": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--topology", "3x1e9"],
                        "3 workers"),
    "auto --memory-limit": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--memory-limit",
                             "lots"], "--memory-limit"),
    "auto --microbatches": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--microbatches",
                             "0,4"], "--microbatches"),
    "auto --run --steps": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--run", "--steps",
                            "1"], "--steps 1"),
    "auto --run --rounds": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--run", "--rounds",
                             "0"], "--rounds must be >= 1"),
    "auto --run --run-seconds": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--run",
                                  "--run-seconds", "0"], "--run-seconds must be > 0"),
    "auto --no-retime": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--no-retime"],
                         "--no-retime only changes what --run times"),
    "auto --plot": (["auto", "--model", "gpt-tiny", "--ranks", "2", "--plot",
                     "{outside}/a-file/p.png"], "--plot"),
    "plan --ranks 0": (["plan", "--model", "gpt-tiny", "--ranks", "0", "--method", "time"],
                       "ranks"),
    "plan --method": (["plan", "--model", "gpt-tiny", "--ranks", "2", "--method", "nope"],
                      "'nope'"),
    "plan --schedule": (["plan", "--model", "gpt-tiny", "--ranks", "2", "--method", "time",
                         "--schedule", "nope"], "'nope'"),
    "plan --shared-cores": (["plan", "--model", "gpt-tiny", "--ranks", "2", "--method", "time",
                             "--shared-cores", "x"], "--shared-cores"),
    "plan --out": (["plan", "--model", "gpt-tiny", "--ranks", "2", "--method", "time", "--out",
                    "{outside}/a-file/plan.json"], "--out"),
    "placement --microbatches": (["placement", "--model", "gpt-tiny", "--topology", "4x1e9",
                                  "--depth", "2", "--microbatches", "3"], "--microbatches 3"),
    "simulate --trace": (["simulate", "1f1b", "--model", "gpt-tiny", "-P", "2", "-M", "4",
                          "--trace", "{outside}/a-file/t.json"], "--trace"),
    "profile --json-out": (["profile", "--model", "gpt-tiny", "--json-out",
                            "{outside}/a-file/p.json"], "--json-out"),
    "tune --bandwidth": (["tune", "--model", "gpt-tiny", "--stages", "2", "--bandwidth", "0"],
                         "--bandwidth"),
    "show --csv": (["show", "1f1b", "--stages", "2", "--microbatches", "4", "--csv",
                    "{outside}/a-file/s.csv"], "--csv"),
}


@pytest.mark.parametrize("name", list(EARLY))
def test_arguments_are_checked_before_profiling(name: str, outside: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _no_profiling(monkeypatch)
    monkeypatch.chdir(tmp_path)
    argv, named = EARLY[name]
    assert main([a.format(outside=outside) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "profil" not in err.split("pipeweave: error:")[0]  # nothing said "profiling ..."
    assert named in _one_line(err.splitlines()[-1] + "\n")
    assert _tree(tmp_path) == []


def _binary(path: Path) -> Path:
    path.write_bytes(bytes(range(256)))
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _not_json(path: Path) -> Path:
    path.write_text("{not json")
    return path


FILES = {  # command line with {file}, what the message names the file as
    "--hf-config": (["train", "--hf-config", "{file}"], "--hf-config"),
    "--plan": (["train", "--plan", "{file}"], "plan file"),
    "plan --profile": (["plan", "--profile", "{file}", "--ranks", "2", "--method", "time"],
                       "profile file"),
    "auto --profile": (["auto", "--profile", "{file}", "--ranks", "2"], "profile file"),
    "simulate --profile": (["simulate", "1f1b", "--profile", "{file}", "-P", "2", "-M", "4"],
                           "profile file"),
}


@pytest.mark.parametrize("make", [_binary, _folder, _not_json], ids=["binary", "folder",
                                                                     "not-json"])
@pytest.mark.parametrize("name", list(FILES))
def test_an_unreadable_file_argument_is_named_with_the_fix(
        name: str, make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _no_profiling(monkeypatch)
    monkeypatch.chdir(tmp_path)
    file = make(tmp_path / "given.json")
    argv, named = FILES[name]
    assert main([a.format(file=file) for a in argv]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{named} {file}" in err
    assert "codec" not in err and "Errno" not in err
    assert "; give" in err or "; create" in err  # the fix
    assert _tree(tmp_path) == [file.name]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--batch-size", "0"], ["--timeout", "0"],
                                  ["--stages", "0"], ["--checkpoint-every", "-1"],
                                  ["--schedule", "nosuch"], ["--lr", "nan"],
                                  ["--momentum", "0.9"], ["--option", "sliced"]],
                         ids=lambda argv: " ".join(argv))
def test_train_checks_its_arguments_before_building_the_model(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A Hugging Face model takes seconds to build: what does not depend on it comes first."""
    def forbidden(self: Any) -> Any:
        raise AssertionError("built the model before the arguments were checked")

    monkeypatch.setattr(cmd_train.BuiltinModel, "__call__", forbidden)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--model", "gpt-tiny", *argv]) == 2
    _one_line(capsys.readouterr().err)
    assert _tree(tmp_path) == []
