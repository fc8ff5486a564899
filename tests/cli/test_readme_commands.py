"""Every command of the README's command-line block runs (issue 13: the README holds from a
fresh clone). Each line is run in-process in one scratch folder, in order (the resume and the
plan use what the lines before them wrote), with step and repeat counts cut down so the whole
block takes a few minutes; nothing else is changed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipeweave.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[list[str]]:
    """The ``pipeweave ...`` lines of the block under "## The command line"."""
    text = README.read_text()
    section = text[text.index("## The command line"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")].replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("pipeweave "):
            commands.append(shlex.split(line)[1:])
    return commands


def shortened(argv: list[str]) -> list[str]:
    """Fewer steps and repeats; the same options otherwise."""
    out = list(argv)
    for flag, new in (("--steps", lambda n: str(max(2, n // 50))),
                      ("--checkpoint-every", lambda n: "1")):
        if flag in out:
            index = out.index(flag) + 1
            out[index] = new(int(out[index]))
    if out[0] == "train":
        out += ["--no-progress"] + ([] if "--steps" in out else ["--steps", "2"])
    if out[0] == "profile":
        out += ["--repeats", "1", "--warmup", "0"]
    if out[0] == "tune":
        out += ["--microbatches-grid", "2,4", "--pipelines-grid", "1,2", "--iterations", "2"]
    return out


COMMANDS = readme_commands()


def test_the_readme_block_was_found() -> None:
    assert len(COMMANDS) >= 20
    assert {argv[0] for argv in COMMANDS} >= {"schedules", "show", "simulate", "train", "tune",
                                              "profile", "plan"}


OUTPUT_FLAGS = ("--json-out", "--out", "--plot", "--trace", "--profile-out", "--output-dir",
                "--checkpoint-dir")


def test_what_the_readme_commands_write_is_ignored_by_git() -> None:
    """Every file or folder the block's lines write into the working folder (named by an
    output flag, or a command's default: train's runs/, auto's auto-plan.json and
    auto-pareto.png) is named in .gitignore, so running the README in a clone leaves
    `git status` clean."""
    from pipeweave.cli.main import build_parser

    written = {"runs"}
    for argv in COMMANDS:
        args = build_parser().parse_args(argv)
        for flag in OUTPUT_FLAGS:
            value = getattr(args, flag[2:].replace("-", "_"), None)
            if value is not None:
                written.add(Path(value).parts[0])
    ignored = {line.strip().strip("/") for line in
               (README.parent / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {"auto-plan.json", "auto-pareto.png", "profile.json"} <= written
    assert written <= ignored, sorted(written - ignored)


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_every_readme_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in COMMANDS:
        command = shortened(argv)
        code = main(command)
        out, err = capsys.readouterr()
        assert code == 0, f"pipeweave {' '.join(command)} exited {code}: {err[-2000:]}"
        assert not re.search(r"Traceback", err), (command, err[-2000:])
    assert (tmp_path / "sim.png").exists() and (tmp_path / "result.json").exists()
    assert (tmp_path / "runs" / "latest").is_symlink()
