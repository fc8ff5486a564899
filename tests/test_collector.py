"""``pipeweave.collector.paused_collection`` turns the collector off for its body only, nested
or not, and after an error too; ``exit_without_collection`` ends the program with its status
and nothing live left for the collector to scan (the command line's entry)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.collector import frozen_between, paused_collection


def test_paused_then_restored() -> None:
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            with paused_collection():
                assert not gc.isenabled()
                with paused_collection():
                    assert not gc.isenabled()
                assert not gc.isenabled()
            assert gc.isenabled() is enabled
        gc.enable()
        with pytest.raises(RuntimeError), paused_collection():
            raise RuntimeError("boom")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


SRC = str(Path(__file__).resolve().parents[1] / "src")
FROZEN_AT_EXIT = """
import atexit, gc
from pipeweave.collector import exit_without_collection
held = [[i] for i in range(1000)]
atexit.register(lambda: print("frozen", gc.get_freeze_count() >= 1000, flush=True))
exit_without_collection(3)
"""


def test_the_exit_keeps_its_status_and_leaves_the_heap_frozen() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", FROZEN_AT_EXIT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3 and done.stdout.strip() == "frozen True"


def test_the_program_exits_with_the_commands_status() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    bad = subprocess.run([sys.executable, "-m", "pipeweave", "no-such-command"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    good = subprocess.run([sys.executable, "-m", "pipeweave", "--version"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and good.stdout.startswith("pipeweave ")


def test_frozen_between_freezes_after_each_item_and_unfreezes_at_the_end() -> None:
    assert gc.get_freeze_count() == 0
    seen = []
    for item in frozen_between(range(3)):
        seen.append((item, gc.get_freeze_count() > 0))
        held = [[item] for _ in range(100)]  # live when the next item is asked: frozen then
    assert [s for s, _ in seen] == [0, 1, 2]
    assert [frozen for _, frozen in seen] == [False, True, True]
    assert gc.get_freeze_count() == 0 and held


def test_frozen_between_unfreezes_after_a_break_and_an_error() -> None:
    for item in frozen_between(range(5)):
        if item == 2:
            assert gc.get_freeze_count() > 0
            break
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        for item in frozen_between(range(5)):
            if item == 1:
                raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_frozen_between_leaves_a_callers_freeze_alone() -> None:
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        held = [[i] for i in range(100)]
        assert list(frozen_between(range(3))) == [0, 1, 2]
        assert gc.get_freeze_count() == count and held
    finally:
        gc.unfreeze()
