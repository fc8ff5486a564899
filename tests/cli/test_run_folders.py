"""Each run gets its own folder, runs/latest links to the newest (issue 13, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main

TINY = ["train", "--model", "mlp", "--batch-size", "16", "--no-progress", "--steps", "1",
        "--executor", "local"]


def test_every_run_keeps_its_own_folder_and_latest_links_to_the_newest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*TINY]) == 0
    assert main([*TINY, "--schedule", "gpipe"]) == 0
    out = capsys.readouterr().out
    folders = sorted(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    assert len(folders) == 2
    assert folders[0].name.endswith("-1f1b") and folders[1].name.endswith("-gpipe")
    for folder in folders:
        assert json.loads((folder / "summary.json").read_text())["steps"] == 1
        assert str(Path("runs") / folder.name) in out  # the summary names the folder
    latest = tmp_path / "runs" / "latest"
    assert latest.is_symlink() and latest.resolve() == folders[1].resolve()
    assert json.loads((latest / "summary.json").read_text())["schedule"] == "gpipe"


def test_an_explicit_output_dir_is_used_as_given(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*TINY, "--output-dir", "mine"]) == 0
    assert (tmp_path / "mine" / "summary.json").exists() and not (tmp_path / "runs").exists()
