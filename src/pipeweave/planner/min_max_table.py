"""The min-max dynamic program's choices, kept per weight list (exact reuse).

:func:`~pipeweave.planner.partition.min_max_partition` (Algorithm 1, autopipe.txt §III-B)
computes, for stage count ``j = 1, 2, ...``, the best previous boundary ``k`` of every end
``i``. Row ``j`` depends on rows ``1 .. j - 1`` alone, never on how many stages are finally
asked, and row ``j``'s entry for end ``i`` reads only blocks ``0 .. i - 1``. So one table
grown to ``p`` rows answers, by backtracking, every split into ``p' <= p`` stages of every
prefix of the blocks: the same bounds, to the bit, as a fresh run (the same arithmetic).

A search asks the same weights many times: ``parameters`` for every micro-batch count,
``time`` and AutoPipe for every micro-batch size (the profile's times scaled by
``size / base``), AutoPipe's rebalancing again for each prefix it re-splits. Weights that
differ by a power-of-two factor share a table: multiplying every float by ``2^e`` changes
no rounding (away from overflow and subnormals, which the key refuses), so every sum,
difference, maximum and first minimum of the program is the same. Tables are kept for the
last :data:`CACHE_SIZE` weight lists (``tests/planner/test_min_max_table.py`` compares them
with the uncached program).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["CACHE_SIZE", "MinMaxTable", "backtrack", "table_for", "dp_step", "span_matrix"]

CACHE_SIZE = 16
"""Weight lists whose tables are kept (1,000 blocks x 512 stages: about 2 MB each)."""

_LOW, _HIGH = 2.0 ** -600, 2.0 ** 600
"""Nonzero weights outside this range, or spread over more than its lower end, are not
cached: every sum and difference of them and of their scaled copies stays a normal float."""


def span_matrix(weights: np.ndarray) -> np.ndarray:
    """``span[i, k] = S[i] - S[k]`` (blocks ``k .. i - 1``), ``inf`` where ``k >= i``."""
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    span = prefix[:, None] - prefix[None, :]
    span[np.triu_indices(len(prefix))] = np.inf
    return span


def dp_step(time: np.ndarray, span: np.ndarray, out: np.ndarray,
            infeasible: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One row of the program: ``min over k of max(time[k], span[i, k])`` for every ``i``,
    the first minimum (smallest ``k``); ``infeasible[i, k]`` rules pairs out. Returns the
    new ``time`` and the chosen ``k`` of every ``i``."""
    np.maximum(time[None, :], span, out=out)
    if infeasible is not None:
        out[infeasible] = np.inf
    best = np.argmin(out, axis=1)
    return out[np.arange(len(time)), best], best


def backtrack(choices: Sequence[np.ndarray], end: int) -> tuple[tuple[int, int], ...]:
    """The stages' ``(start, end)`` read back from the program's choices: ``choices[j][i]``
    is where the last of ``j + 2`` stages ending at block ``i`` starts."""
    out = []
    for best in reversed(choices):
        start = int(best[end])
        out.append((start, end))
        end = start
    out.append((0, end))
    out.reverse()
    return tuple(out)


class MinMaxTable:
    """The program's choices for one weight list, grown one stage count at a time."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        self.choices: list[np.ndarray] = []
        self._time = span_matrix(weights)[:, 0].copy()

    def bounds(self, stages: int, end: int) -> tuple[tuple[int, int], ...]:
        """The min-max split of blocks ``0 .. end - 1`` into ``stages`` stages (the caller
        has checked ``1 <= stages <= end``)."""
        self._grow(stages - 1)
        return backtrack(self.choices[:stages - 1], end)

    def _grow(self, rows: int) -> None:
        if len(self.choices) >= rows:
            return
        span = span_matrix(self.weights)
        buffer = np.empty_like(span)
        time = self._time
        while len(self.choices) < rows:
            time, best = dp_step(time, span, buffer)
            self.choices.append(best.astype(np.int32))
        self._time = time


_tables: OrderedDict[bytes, MinMaxTable] = OrderedDict()


def table_for(weights: Sequence[float]) -> MinMaxTable | None:
    """The kept table of ``weights`` (module docstring), made on first use; None where the
    weights are not cacheable (negative, not finite, or near under- or overflow)."""
    values = np.asarray(weights, dtype=float)
    key = _normalised(values)
    if key is None:
        return None
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = MinMaxTable(np.frombuffer(key, dtype=float))
        while len(_tables) > CACHE_SIZE:
            _tables.popitem(last=False)
    _tables.move_to_end(key)
    return table


def _normalised(values: np.ndarray) -> bytes | None:
    """``values`` scaled exactly by a power of two so the largest lies in ``[0.5, 1)``."""
    if len(values) == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
        return None
    nonzero = values[values > 0]
    if len(nonzero) == 0 or nonzero.min() < _LOW or nonzero.max() > _HIGH or \
            nonzero.min() < _LOW * nonzero.max():
        return None
    exponent = math.frexp(float(nonzero.max()))[1]
    return np.ldexp(values, -exponent).tobytes()
