"""Failures reported truthfully (issue 24, item 4), with real processes and real signals.

``pipeweave train`` runs as a subprocess in its own session, as from a terminal:

* a rank SIGKILLed mid-run (``PIPEWEAVE_INJECT_FAULT``): one ``pipeweave: error:`` line naming
  the rank once, no traceback, no torch "Terminating process" or resource_tracker "leaked
  semaphore" noise, and the outputs hold exactly the steps that completed;
* Ctrl-C (SIGINT to the whole process group, as a terminal sends it, or to the launcher
  alone) mid-run, while the ranks start and while the command is still importing: one line,
  no traceback, status 130, and the outputs hold the steps that completed.

The damaged-checkpoint messages are tested in tests/checkpoint/test_bad_checkpoints.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeweave.runtime.launch.faults import FAULT_ENV

pytestmark = pytest.mark.distributed
SRC = Path(__file__).resolve().parents[2] / "src"
TRAIN = ["train", "--model", "mlp", "--batch-size", "16", "--microbatches", "4",
         "--timeout", "30"]
NOISE = ("Traceback", "leaked semaphore", "Terminating process", "KeyboardInterrupt",
         "ProcessGroupGloo", "Connection closed")


class Train:
    """``python -m pipeweave train ...`` in a new session; stderr collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipeweave", *TRAIN, *args],
            env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            # a Ctrl-C must reach it even where this test runs with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        while chunk := os.read(self.process.stderr.fileno(), 4096):
            self._chunks.append(chunk)

    @property
    def stderr(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, ready: Callable[[], bool], within_s: float = 150) -> None:
        """Until ``ready()``; a run that ends first or takes too long is stopped and fails."""
        deadline = time.monotonic() + within_s
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._kill()
                raise AssertionError(f"not ready (status {self.process.returncode}):\n"
                                     f"{self.stderr}")
            time.sleep(0.05)

    def _kill(self) -> None:
        """SIGKILL the launcher's whole group (it and its ranks), if it still runs."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def steps_shown(self) -> int:
        """The progress bar's latest count of steps done."""
        counts = re.findall(r"(\d+)/\d+ \[", self.stderr)
        return int(counts[-1]) if counts else 0

    def ranks_started(self) -> bool:
        """Whether a rank process exists: a child of a child of the launcher (of the fork
        server, which the launcher started with SIGINT ignored)."""
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
        children = {pid for pid, parent in parents.items() if parent == self.process.pid}
        return any(parent in children for parent in parents.values())

    def interrupt(self, target: str) -> None:
        """SIGINT to the process group (a terminal's Ctrl-C) or to the launcher alone."""
        if target == "group":
            os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.send_signal(signal.SIGINT)

    def finish(self, within_s: float = 120) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout=within_s)
        finally:
            self._kill()
        self._reader.join(timeout=10)
        return code, self.stderr


def _one_error_line(stderr: str) -> str:
    for noise in NOISE:
        assert noise not in stderr, stderr
    (line,) = [line for line in stderr.splitlines() if "pipeweave: error:" in line]
    return line[line.index("pipeweave: error:"):]


def _kept(folder: Path) -> int:
    """The steps the outputs hold; every output agrees with summary.json."""
    summary = json.loads((folder / "summary.json").read_text())
    steps = summary["steps"]
    metrics = (folder / "metrics.jsonl").read_text().splitlines() if steps else []
    assert [json.loads(row)["step"] for row in metrics] == list(range(1, steps + 1))
    assert len(summary.get("losses", [])) == steps
    if steps:
        assert (folder / "trace.json").stat().st_size > 0 and (folder / "loss.png").exists()
    return int(steps)


@pytest.mark.timeout(240)
def test_a_killed_rank_is_one_line_and_the_completed_steps_are_kept(tmp_path: Path) -> None:
    # rank 1 (the last stage, which shows the progress bar) dies by SIGKILL during step 7
    run = Train(["--steps", "400", "--output-dir", str(tmp_path)], env={FAULT_ENV: "rank=1,step=7"})
    code, stderr = run.finish(within_s=200)
    assert code == 1, stderr
    line = _one_error_line(stderr)
    assert line.startswith("pipeweave: error: rank 1: exited with code -9 (signal SIGKILL)"), line
    assert line.count("rank 1") == 1, line
    assert f"details in {tmp_path / 'error.log'}" in line
    assert "killed from outside" in (tmp_path / "error.log").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("rank 1: exited")
    assert _kept(tmp_path) == 6  # steps 1-6 completed on every rank; step 7 did not
    assert "kept the 6 completed steps" in stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("target", "every"), [("group", 0), ("launcher", 0), ("group", 10)],
                         ids=["group", "launcher", "group-checkpoints"])
def test_ctrl_c_mid_run_keeps_the_completed_steps(target: str, every: int, tmp_path: Path) -> None:
    run = Train(["--steps", "2000", "--output-dir", str(tmp_path),
                 *(["--checkpoint-every", str(every)] if every else [])])
    run.wait_for(lambda: run.steps_shown() >= 5 + 2 * every)  # with checkpoints: one complete
    shown = run.steps_shown()
    run.interrupt(target)
    code, stderr = run.finish()
    assert code == 130, stderr
    assert _one_error_line(stderr).startswith("pipeweave: error: interrupted (Ctrl-C)")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert _kept(tmp_path) >= shown
    if every:
        assert "continue from the last complete checkpoint with --resume" in stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("target", ["group", "launcher"])
def test_ctrl_c_while_the_ranks_start_is_one_line(target: str, tmp_path: Path) -> None:
    run = Train(["--steps", "2000", "--no-progress", "--output-dir", str(tmp_path)])
    run.wait_for(run.ranks_started)
    run.interrupt(target)
    code, stderr = run.finish()
    assert code == 130, stderr
    assert _one_error_line(stderr).startswith("pipeweave: error: interrupted (Ctrl-C)")
    if (tmp_path / "summary.json").exists():  # none when it stopped before the launch
        _kept(tmp_path)


@pytest.mark.timeout(120)
def test_ctrl_c_while_importing_is_one_line(tmp_path: Path) -> None:
    run = Train(["--steps", "3", "--output-dir", str(tmp_path)])
    time.sleep(0.5)  # importing torch takes longer than this
    run.interrupt("group")
    code, stderr = run.finish()
    assert code in (130, -signal.SIGINT), stderr
    if code == 130:
        assert stderr == "pipeweave: error: interrupted (Ctrl-C)\n"
    else:  # -SIGINT: before Python listened at all (no output), or after our one line (1 test
        # of a CI run, 2 of 10 runs under load, 2026-11-27, when the Ctrl-C could land inside
        # torch's import). Since the command line holds a Ctrl-C until its command's modules
        # are imported (cli/main, pipeweave.interrupts.ctrl_c_deferred: a CI run had seen the interrupt swallowed
        # there and the run fail later on a half-imported numpy), 10 of 10 runs interrupted
        # 0.2-3.2 s in ended 130 with the one line. Never a traceback.
        assert stderr in ("", "pipeweave: error: interrupted (Ctrl-C)\n")
