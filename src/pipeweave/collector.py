"""Python's cyclic garbage collector paused around allocation-heavy passes: the
simulator's walk, the planner's analysis of a schedule's shape, the memory predictions.

A simulation, an analysis of a schedule's shape (:mod:`pipeweave.planner.memory_shape`) or a
memory prediction allocates
millions of tuples (actions, positions, intervals), none in a cycle, and every allocation
threshold crossed makes the collector rescan the live heap, the cached analyses included:
at 64 ranks x 512 micro-batches 40 % of an analysis's time, a third of a simulation's. Pausing it changes no value;
what is garbage is collected once collection resumes.

A process that ends after such a search holds those caches until it exits, and Python's
shutdown runs the collector over them once more before freeing them (6 of the 80 s of
``auto`` at planning scale, 2026-11-27): :func:`exit_without_collection` spares the
command line that last scan.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_collection", "exit_without_collection"]


@contextmanager
def paused_collection() -> Iterator[None]:
    """Run the body with the collector off, then restore it as it was (nested use is
    safe: an inner pause leaves it off for the outer one)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def exit_without_collection(status: int) -> None:
    """Leave the process with ``status`` without the collector's last scan of the heap at
    shutdown (``gc.freeze``: what is live now is never scanned again). Only for a process
    about to end (the command line's entry points), never inside a library call: the
    objects it freezes are then never collected."""
    gc.freeze()
    raise SystemExit(status)
