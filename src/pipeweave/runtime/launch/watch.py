"""Watching local rank processes: wait for the first to fail, stop the rest.

Used by :func:`.processes.launch_local` instead of torch's ``ProcessContext.join``, which
logs a "Terminating process ..." warning on the terminal for every rank it stops; stopping
ranks after another failed is the expected way a run ends, not news (the launcher says in
one line why the run ended).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from .interrupts import ctrl_c_deferred

__all__ = ["first_failure", "let_ranks_stop", "stop_ranks", "killed_by"]


def first_failure(processes: Sequence[BaseProcess], deadline_s: float | None = None) -> int | None:
    """Wait until every process has exited; the index of the first one that exited with a
    non-zero code as soon as one does (None when all succeeded). ``TimeoutError`` once
    ``deadline_s`` seconds have passed."""
    started = time.monotonic()
    waiting = {process.sentinel: index for index, process in enumerate(processes)}
    while waiting:
        for sentinel in wait(list(waiting), timeout=0.5):
            index = waiting.pop(sentinel)  # type: ignore[arg-type]
            processes[index].join()
            if processes[index].exitcode != 0:
                return index
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            raise TimeoutError(f"run exceeded its deadline of {deadline_s:.0f} s; stopped all ranks")
    return None


def let_ranks_stop(processes: Sequence[BaseProcess], grace_s: float = 5.0) -> None:
    """After a Ctrl-C, give the ranks a moment to record what they did (a terminal sent them
    the SIGINT too; send it anyway, for a signal that reached the launcher alone), then
    :func:`stop_ranks` stops the rest. A second Ctrl-C meanwhile changes nothing."""
    with ctrl_c_deferred(replay=False):
        for process in processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))


def stop_ranks(processes: Sequence[BaseProcess], grace_s: float = 10.0) -> None:
    """SIGTERM every process still alive, SIGKILL any still there after ``grace_s``."""
    with ctrl_c_deferred(replay=False):
        for process in processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + grace_s
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(timeout=grace_s)


def killed_by(process: BaseProcess) -> str | None:
    """The name of the signal that ended ``process`` (``SIGKILL``), if one did."""
    code = process.exitcode
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
