"""The README's "Your own data" commands run as written (fewer steps), on a text file and a
``.bin`` made here, in one scratch folder, in order: the last one resumes what the second
wrote."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from pipeweave.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"
TEXT = "".join(f"{i}: pipelines cut a model into stages that run at once\n" for i in range(200))


def own_data_commands() -> list[list[str]]:
    section = README.read_text().split("## Your own data", 1)[1]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [shlex.split(line.split("#", 1)[0])[1:] for line in block.splitlines()
            if line.startswith("pipeweave ")]


def _shortened(argv: list[str]) -> list[str]:
    out = list(argv)
    for flag, value in (("--steps", lambda n: n // 100), ("--eval-every", lambda n: n // 50),
                        ("--checkpoint-every", lambda n: n // 100)):
        if flag in out:
            index = out.index(flag) + 1
            out[index] = str(value(int(out[index])))
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
