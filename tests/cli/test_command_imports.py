"""The command line imports only the command module it is asked for (``cli.main._asked``):
``pipeweave auto ...`` parses as with every command, without importing ``train``'s; and
``pipeweave auto`` plans from a saved profile (and prints ``--help``) without importing torch
(issue 29: torch costs a second or more of CPU before anything is done)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeweave.cli.main import COMMANDS, _asked
from pipeweave.profiler import BlockProfile, Profile

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


def _torch_loaded_after(code: str) -> list[str]:
    """The torch modules loaded once ``code`` ran in a fresh interpreter."""
    check = (f"import sys\n{code}\nprint(sorted(m for m in sys.modules "
             "if m == 'torch' or m.startswith('torch.'))[:3])")
    done = subprocess.run([sys.executable, "-c", check], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return eval(done.stdout.splitlines()[-1])  # a printed list of names


def test_auto_plans_from_a_saved_profile_without_torch(tmp_path: Path) -> None:
    """No ``--run`` and no ``--model``: nothing is measured, so nothing needs torch."""
    blocks = tuple(BlockProfile(f"b{i}", forward=1e-3 * (i + 1), backward=2e-3 * (i + 1),
                                output_bytes=1e5, activation_bytes=1e6, parameter_bytes=1e6,
                                optimizer_bytes=0.0) for i in range(6))
    profile = tmp_path / "profile.json"
    Profile(blocks, model="gpt-tiny", batch_size=4, device="synthetic",
            source="synthetic").save(profile)
    argv = ["auto", "--profile", str(profile), "--ranks", "2", "--top", "2", "--json",
            "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "front.png")]
    code = f"from pipeweave.cli.main import main\nassert main({argv!r}) == 0"
    assert _torch_loaded_after(code) == []
    assert (tmp_path / "plan.json").exists()


def test_auto_help_without_torch() -> None:
    code = ("from pipeweave.cli.main import main\ntry:\n    main(['auto', '--help'])\n"
            "except SystemExit as stop:\n    assert stop.code == 0")
    assert _torch_loaded_after(code) == []
