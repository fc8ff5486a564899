"""Holding a Ctrl-C through a block that must not be cut in two, torch-free.

Two callers need it: the launcher, so a Ctrl-C never lands between two rank starts, and the
command line, so it never lands inside torch's or numpy's import (where a library's bare
``except`` can swallow the ``KeyboardInterrupt`` and leave a half-imported module behind: a
CI run, 2026-11-27, went on and failed later with ``module 'numpy' has no attribute
'iterable'``). This module imports nothing heavy, so the command line can hold the interrupt
before the first of those imports starts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["in_main_thread", "ctrl_c_deferred"]


def in_main_thread() -> bool:
    """Signal handlers can only be changed there; elsewhere the helpers here do nothing."""
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def ctrl_c_deferred(*, replay: bool = True) -> Iterator[None]:
    """Within the block, a SIGINT is noted instead of raised; on leaving, it is handed to the
    handler that was in place (Python's default raises ``KeyboardInterrupt``; the system's
    default, ``SIG_DFL``, ends the process as the signal would have), or with ``replay`` False
    dropped (while the launcher is already stopping the run). An ignored SIGINT stays ignored.
    Off the main thread the block runs as it is."""
    if not in_main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and replay:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
