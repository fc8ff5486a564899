"""The README's "Your own data" commands run as written (fewer steps), on a text file and a
``.bin`` made here, in one scratch folder, in order: the last one resumes what the second
wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeweave.cli.main import main
from readme_blocks import block_commands, shortened

TEXT = "".join(f"{i}: pipelines cut a model into stages that run at once\n" for i in range(200))


def own_data_commands() -> list[list[str]]:
    return block_commands("Your own data")


def _shortened(argv: list[str]) -> list[str]:
    out = shortened(argv, {"--steps": 100, "--eval-every": 50, "--checkpoint-every": 100})
    return [*out, "--no-progress", "--batch-size", "4"]


@pytest.mark.timeout(600)
def test_the_own_data_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("my_corpus.txt").write_text(TEXT, encoding="utf-8")
    np.frombuffer(TEXT.encode(), dtype=np.uint8).astype(np.uint16).tofile("train.bin")
    commands = own_data_commands()
    assert len(commands) == 3 and all("--data" in argv for argv in commands)
    for argv in commands:
        assert main(_shortened(argv)) == 0, argv
    assert any(Path("runs/mine").glob("step-*"))
