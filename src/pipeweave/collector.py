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

A search that examines tens of thousands of candidates builds those caches as it goes, and
each full collection rescanned all of them (11 collections over the planning-scale search,
a tenth of its time, 2026-11-27): :func:`frozen_between` freezes what is live after each
candidate (``gc.freeze``, no copy: the collector's lists are spliced), so a collection scans
only what the candidate at hand allocated, and unfreezes it all when the iteration ends
(a cycle that became garbage meanwhile is collected then). No value changes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["paused_collection", "exit_without_collection", "frozen_between"]

T = TypeVar("T")


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


def frozen_between(items: Iterable[T]) -> Iterator[T]:
    """``items``, with what is live frozen after each (module docstring) and unfrozen when
    the iteration ends, stops early or fails (the generator is closed then). Left as is
    where the caller had frozen objects itself (``gc.get_freeze_count()``): unfreezing at
    the end would release those too."""
    if gc.get_freeze_count():
        yield from items
        return
    try:
        for item in items:
            yield item
            gc.freeze()
    finally:
        gc.unfreeze()
