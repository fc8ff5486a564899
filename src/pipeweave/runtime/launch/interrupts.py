"""Ctrl-C around local ranks: one clean stop, never a traceback from a helper process.

A Ctrl-C in a terminal sends SIGINT to the whole process group: the launcher, the
``forkserver`` process (which may still be importing torch) and every rank (which may still
be starting inside multiprocessing's bootstrap, before any pipeweave code runs). Python's
default handler turns each into a ``KeyboardInterrupt`` traceback on the terminal. So:

* :func:`start_forkserver_deaf` starts the fork server with SIGINT ignored; the ranks it
  forks inherit that, and stay deaf to Ctrl-C until :func:`listen_for_ctrl_c` (the first
  thing a rank does inside pipeweave's own error handling). The launcher alone decides how
  the run stops, and stops the ranks itself.
* :func:`ctrl_c_deferred` (from :mod:`pipeweave.interrupts`, torch-free) holds a Ctrl-C to the launcher while it starts the ranks, so it
  never lands between two process starts (leaving ranks it does not know of), and raises it
  right after.
"""

from __future__ import annotations

import signal
from multiprocessing import forkserver, resource_tracker

from ...interrupts import ctrl_c_deferred, in_main_thread

__all__ = ["start_forkserver_deaf", "ctrl_c_deferred", "listen_for_ctrl_c"]


def start_forkserver_deaf() -> None:
    """Start multiprocessing's fork server, if it is not running, with SIGINT ignored (an
    ignored signal stays ignored across exec and fork). A Ctrl-C to the launcher in the
    millisecond the fork server takes to start is lost (another one works); one already
    running fork server is left as it is."""
    resource_tracker.ensure_running()  # first, outside that millisecond (it ignores SIGINT)
    if not in_main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def listen_for_ctrl_c() -> None:
    """In a rank: from now on a SIGINT (the terminal's Ctrl-C, or the launcher stopping the
    run) raises ``KeyboardInterrupt``, so the rank stops through its own error handling."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
