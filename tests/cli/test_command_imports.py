"""The command line imports only the command module it is asked for (``cli.main._asked``):
``pipeweave auto ...`` parses as with every command, without importing ``train``'s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeweave.cli.main import COMMANDS, _asked

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_the_named_command_alone_else_all() -> None:
    assert _asked(["auto", "--ranks", "2"]) == ["auto"]
    assert _asked(["schedules"]) == ["schedules"]
    for argv in ([], ["--version"], ["-h"], ["autox"], ["--ranks", "auto"]):
        assert _asked(argv) == list(COMMANDS)


def test_a_command_runs_without_importing_the_others() -> None:
    code = ("import sys; from pipeweave.cli.main import main; status = main(['schedules']); "
            "print(status, sorted(m for m in sys.modules if m.startswith('pipeweave.cli.cmd_')))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 ['pipeweave.cli.cmd_schedules']"
