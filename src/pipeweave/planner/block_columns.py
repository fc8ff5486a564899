"""A profile's per-block costs as columns, read once per profile for the stage sums.

:func:`pipeweave.planner.evaluate.plan_costs` sums, for every stage of every plan, six
per-block quantities over the stage's blocks. ``pipeweave auto`` asks it for thousands of
plans of one profile (1,000 blocks at planning scale), each a walk over the block records;
here the values are read once per profile into tuples, and a stage's sum is ``sum`` over a
slice of them: the same values added in the same order from the same start, so the same
floats (``tests/planner/test_block_columns.py`` compares with the per-block sums with
``==``). Kept for the last :data:`CACHE_SIZE` profiles, by identity.
"""

from __future__ import annotations

from typing import NamedTuple

from ..profiler import Profile

__all__ = ["BlockColumns", "block_columns", "CACHE_SIZE"]

CACHE_SIZE = 16
"""Profiles whose columns are kept (a search scales one profile to a few micro-batch sizes,
and prices Slicer halves at half of each)."""


class BlockColumns(NamedTuple):
    """Per block: forward, backward, activation bytes, update, ``W`` and ``I`` times."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    activation: tuple[float, ...]
    update: tuple[float, ...]
    weight: tuple[float, ...]
    """``weight_grad`` where measured (> 0), else half the backward (the simulator's default)."""
    input: tuple[float, ...]
    """``input_grad`` where measured (> 0), else the backward less :attr:`weight`'s value."""


_KEPT: dict[int, tuple[Profile, BlockColumns]] = {}


def block_columns(profile: Profile) -> BlockColumns:
    """``profile``'s :class:`BlockColumns`, read once while it is among the last kept."""
    kept = _KEPT.get(id(profile))
    if kept is not None and kept[0] is profile:
        return kept[1]
    blocks = profile.blocks
    weight = tuple(b.weight_grad if b.weight_grad > 0 else b.backward / 2 for b in blocks)
    columns = BlockColumns(
        forward=tuple(b.forward for b in blocks), backward=tuple(b.backward for b in blocks),
        activation=tuple(b.activation_bytes for b in blocks),
        update=tuple(b.update for b in blocks), weight=weight,
        input=tuple(b.input_grad if b.input_grad > 0 else b.backward - w
                    for b, w in zip(blocks, weight)))
    if len(_KEPT) >= CACHE_SIZE:
        del _KEPT[next(iter(_KEPT))]
    _KEPT[id(profile)] = (profile, columns)
    return columns
