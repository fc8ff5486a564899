"""Python's cyclic garbage collector paused around allocation-heavy passes: the
simulator's walk, the planner's analysis of a schedule's shape, the memory predictions.

A simulation, an analysis of a schedule's shape (:mod:`pipeweave.planner.memory_shape`) or a
memory prediction allocates
millions of tuples (actions, positions, intervals), none in a cycle, and every allocation
threshold crossed makes the collector rescan the live heap, the cached analyses included:
at 64 ranks x 512 micro-batches 40 % of an analysis's time, a third of a simulation's. Pausing it changes no value;
what is garbage is collected once collection resumes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_collection"]


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
