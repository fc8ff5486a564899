"""Holding a Ctrl-C through a block (pipeweave/interrupts.py): the launcher starting ranks and
the command line importing its command's modules both use it. Raised on leaving, dropped
while stopping, handed to whatever handler was in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.interrupts import ctrl_c_deferred

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_ctrl_c_while_deferred_is_raised_on_leaving() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")  # not interrupted here
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_while_stopping_is_dropped() -> None:
    with ctrl_c_deferred(replay=False):
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ctrl_c_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.timeout(60)
def test_under_the_system_default_a_held_ctrl_c_ends_the_process_on_leaving() -> None:
    code = ("import os, signal, sys\n"
            "from pipeweave.interrupts import ctrl_c_deferred\n"
            "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "with ctrl_c_deferred():\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    print('held', flush=True)\n"
            "print('not reached', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=50)
    assert done.returncode == -signal.SIGINT, (done.returncode, done.stderr)
    assert done.stdout == "held\n"


def test_the_module_imports_nothing_heavy() -> None:
    code = "import sys, pipeweave.interrupts; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=50)
    assert done.stdout.strip() == "[]", done.stderr
