"""Per-stage numbers read off one profile, kept for the stage splits asked again.

A search asks a plan's per-stage parameter and optimizer bytes several times (the static
memory, the held floor, the memory model) and for every plan that shares its split (every
schedule, recompute prefix and micro-batch count of one partition): a sum over the blocks
of every stage each time, 1,000 blocks at planning scale. :func:`kept` remembers the answer
by the profile's identity (profiles are immutable) and the question's key, for the last
:data:`CACHE_SIZE` questions; a profile that is gone is never confused with a new one at
the same address (a weak reference is checked).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

from ..profiler import Profile

__all__ = ["CACHE_SIZE", "kept"]

CACHE_SIZE = 256
"""Answers kept (each a list of one number per stage)."""

T = TypeVar("T")

_kept: OrderedDict[tuple[int, Hashable], tuple[weakref.ref[Profile], object]] = OrderedDict()


def kept(profile: Profile, key: Hashable, make: Callable[[], T]) -> T:
    """``make()``, remembered for ``(profile, key)``; the caller must not change it."""
    slot = (id(profile), key)
    hit = _kept.get(slot)
    if hit is not None and hit[0]() is profile:
        _kept.move_to_end(slot)
        return hit[1]  # type: ignore[return-value]
    value = make()
    _kept[slot] = (weakref.ref(profile), value)
    while len(_kept) > CACHE_SIZE:
        _kept.popitem(last=False)
    return value
