"""One level of PipeDream's dynamic program, solved exactly with branch and bound.

:mod:`pipeweave.planner.pipedream` states the recurrence (pipedream.txt §3.1); on one level
with ``K`` components it reads, for a row (first block ``i``), an end ``j`` and ``m``
components::

    A(i, j, m) = min( single(i, j, m),
                      min_{i < s < j, 1 <= m' < m} max( A(i, s, m - m'), tail(s, j, m') ) )
    tail(s, j, m') = max( 2 a_s / B,  T(s -> j, m') )      (inf where memory does not fit)

Enumerated as printed this is ``O(N^2 K^2)`` per row, and the levels below the top need
every row: minutes for 1,000 blocks on 64 or 1,024 workers. These facts make it fast without
changing a single result (``tests/planner/test_pipedream_golden.py`` holds the enumeration's
answers, ties included):

1. **Values and choices are separate.** ``A`` is a minimum over a set of floats (maxima of
   the same stage and transfer times, computed with the same operations), so any exact way
   of finding that minimum gives the same bits. Which ``(s, m')`` attains it (ties: the
   first in ``s``-major order, and only when strictly better than ``single``) matters only
   on the cells the flattening visits (one per stage): :meth:`LevelSolver.choice` scans
   those in the recurrence's order.
2. **Lower bounds prune exactly.** With non-negative block times, a pipeline of blocks
   ``[i, s)`` on ``k`` components is never faster than its compute spread over all of
   them: ``A(i, s, k) >= C(i, s) / (D k)`` (the slowest stage takes at least its share,
   ``max_t C_t / r_t >= sum C_t / sum r_t``; ``D`` devices in one component), likewise
   ``T(s -> j, m') >= C(s, j) / (D m')``, and a replicated stage waits for its all-reduce,
   ``T >= 4 (m' - 1) |w| / (m'^2 B m_{k-1})``. Given an upper bound ``U >= A(i, j, m)`` —
   the single stage, and the last stage on one component split off where the compute is
   shared ``(m - 1) : 1`` — only the ``s`` meeting all three bounds can attain the
   minimum: a window found by binary search on prefix sums. Candidates never beat the
   transfer at their split, so a cell whose bound already equals ``min comm[s]`` is done.
3. **Only what the top level can use is solved.** The top level fills only the cells that
   can lie on a pipeline as fast as a complete one it evaluates first
   (:meth:`LevelSolver.solve`); a level below fills a row ``i`` (its pipelines of blocks
   ``[i, j)``) only when the level above asks for it, so mostly ranges of about one
   balanced stage.

The windows are widened by a relative 1e-9 so that rounding never prunes a candidate equal
to the minimum. Profiles with a negative or non-finite block time or parameter size (no
such bounds) are searched in full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Memory", "LevelSolver", "prefix_sums"]

_SLACK = 1e-9
"""Relative widening of the pruning windows (rounding of prefix sums and divisions)."""


@dataclass(frozen=True)
class Memory:
    """The single-level memory check: ``held (activation + parameter bytes) + optimizer bytes
    <= limit`` with ``held`` the micro-batches a replica keeps in flight (prefix sums)."""

    activation_prefix: np.ndarray
    parameter_prefix: np.ndarray
    optimizer_prefix: np.ndarray
    limit: float

    def need(self, start: np.ndarray, end: np.ndarray, held: np.ndarray) -> np.ndarray:
        # (act[e] - act[s]) + (par[e] - par[s]): the sum of the two span matrices of the
        # original formulation, element by element, so the same floats
        stash = ((self.activation_prefix[end] - self.activation_prefix[start])
                 + (self.parameter_prefix[end] - self.parameter_prefix[start]))
        optimizer = self.optimizer_prefix[end] - self.optimizer_prefix[start]
        out: np.ndarray = held * stash + optimizer
        return out


@dataclass(frozen=True)
class _Pairs:
    """The ``(m, m')`` pairs of the recurrence, ``m``-major, and the cells ``m`` having any."""

    m: np.ndarray
    mp: np.ndarray
    cells: np.ndarray
    offsets: np.ndarray  # first pair of each cell

    def reduce(self, values: np.ndarray) -> np.ndarray:
        """``[row, pair] -> [row, cell]``: the minimum over each cell's pairs."""
        out: np.ndarray = np.minimum.reduceat(values, self.offsets, axis=1)
        return out


@dataclass(frozen=True)
class _Groups:
    """Every ``(row, pair)``, row-major, for up to ``rows`` rows (a step uses a prefix)."""

    row: np.ndarray
    m: np.ndarray
    mp: np.ndarray
    cell: np.ndarray  # index of (row, cell) in a [row, cell] array
    pair_cell: np.ndarray  # index of the cell, whatever the row

    @classmethod
    def build(cls, rows: int, pairs: _Pairs) -> "_Groups":
        count = len(pairs.m)
        cell_of_pair = np.repeat(np.arange(len(pairs.cells)), np.diff(np.append(pairs.offsets, count)))
        row = np.repeat(np.arange(rows, dtype=np.int64), count)
        return cls(row, np.tile(pairs.m, rows), np.tile(pairs.mp, rows),
                   row * len(pairs.cells) + np.tile(cell_of_pair, rows),
                   np.tile(cell_of_pair, rows))


def prefix_sums(values: Sequence[float]) -> np.ndarray:
    """``P[k] = sum(values[:k])``, as ``numpy.cumsum`` adds them (``P[j] - P[i]`` is a span)."""
    out: np.ndarray = np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))
    return out


class LevelSolver:
    """The DP of one level, evaluated lazily: ``time[row, j, m]`` is filled for the rows and
    ends the level above asks for (:meth:`ensure`); :meth:`choice` tells which last stage a
    cell took.

    Args:
        raw: prefix sums of the block times (level 1's compute, and the lower bounds).
        lower: the level below (its best time on all its components is this level's compute),
            ``None`` on level 1.
        weights: prefix sums of the parameter bytes.
        output_bytes: bytes each block outputs (what crosses a boundary after it).
        machines, bandwidth: this level's ``m_k`` and ``B_k``.
        bounded: prune with the lower bounds (they need non-negative times and sizes).
        all_starts: every row ``i`` (levels below the top) or only ``i = 0``.
        straight, overlap: as in :func:`pipeweave.planner.pipedream.pipedream_partition`.
        memory: the top level's memory check; workers: the pipeline's worker count.
    """

    def __init__(self, raw: np.ndarray, lower: "LevelSolver | None", weights: np.ndarray,
                 output_bytes: Sequence[float], machines: int, bandwidth: float, *,
                 bounded: bool, all_starts: bool, straight: bool, overlap: bool,
                 memory: Memory | None, workers: int) -> None:
        self.n = len(raw) - 1
        self.raw = raw
        self.lower = lower
        self.weights = weights
        self.machines = machines
        self.bandwidth = bandwidth
        self.below = lower.machines if lower is not None else 1
        self.scale: float = float(lower.scale * lower.machines) if lower is not None else 1.0
        self.bounded = bounded
        self.all_starts = all_starts
        self.straight = straight
        self.overlap = overlap
        self.memory = memory
        self.workers = workers
        self.comm = np.zeros(self.n + 1)
        if not math.isinf(bandwidth):
            self.comm[1:] = 2.0 * np.asarray(output_bytes, dtype=float) / bandwidth
        rows = self.n + 1 if all_starts else 1
        self.time = np.full((rows, self.n + 1, machines + 1), np.inf)
        self.done = np.arange(rows, dtype=np.int64)  # row i holds every end <= done[i]
        ms = np.arange(1, machines + 1, dtype=np.int64)
        counts = np.array([len(self.options(int(m))) for m in ms])
        self.ms = ms
        self.pairs = _Pairs(np.repeat(ms, counts),
                            np.concatenate([self.options(int(m)) for m in ms]),
                            ms[counts > 0], (np.cumsum(counts) - counts)[counts > 0])
        self.groups = _Groups.build(rows, self.pairs)
        self.live: np.ndarray | None = None  # top level: [j] -> (lowest, highest) m kept

    # -- costs ---------------------------------------------------------------------------

    def compute(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Compute time of ``[start, end)`` on one component (``inf`` unless ``start < end``)."""
        start, end = np.broadcast_arrays(start, end)
        if self.lower is None:
            out: np.ndarray = np.where(start < end, self.raw[end] - self.raw[start], np.inf)
            return out
        for e in np.unique(end):
            self.lower.ensure(start[end == e], int(e))
        return self.lower.time[start, end, self.lower.machines]

    def stage(self, start: np.ndarray, end: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """``T(start -> end, replicas)``, element-wise, with the original's float operations."""
        compute = self.compute(start, end)
        if math.isinf(self.bandwidth):
            reduce: np.ndarray | float = 0.0
        else:
            weights = self.weights[end] - self.weights[start]
            with np.errstate(invalid="ignore"):
                formula = 4.0 * (replicas - 1) * weights / (replicas * self.bandwidth) / self.below
            reduce = np.where(replicas == 1, 0.0, formula)
        combined = np.maximum(compute, reduce) if self.overlap else compute + reduce
        out: np.ndarray = combined / replicas
        if self.straight:
            out = np.where(replicas == 1, out, np.inf)
        return out

    def tail(self, start: np.ndarray, end: int | np.ndarray, replicas: np.ndarray,
             machines: np.ndarray) -> np.ndarray:
        """``max(2 a_s / B, T(s -> j, m'))`` of a last stage on ``m'`` of ``m`` components."""
        out: np.ndarray = np.maximum(self.comm[start], self.stage(start, np.asarray(end), replicas))
        if self.memory is not None:
            held = -(-(replicas + self.workers - machines) // replicas)
            need = self.memory.need(start, np.asarray(end), held)
            out = np.where(need > self.memory.limit, np.inf, out)
        return out

    def single(self, start: np.ndarray, end: int, machines: np.ndarray) -> np.ndarray:
        """The whole range ``[start, end)`` as one stage on ``m`` components."""
        out = self.stage(start, np.asarray(end), machines)
        if self.memory is not None:  # the whole prefix [0, j) as the input stage
            in_flight = -(-self.workers // machines)
            need = self.memory.need(np.asarray(0), np.asarray(end), in_flight)
            out = np.where(need > self.memory.limit, np.inf, out)
        return out

    def options(self, machines: int) -> np.ndarray:
        """``m'`` of the last stage, in the order the recurrence tries them."""
        return np.arange(1, 2 if self.straight else machines, dtype=np.int64)

    # -- values --------------------------------------------------------------------------

    def solve(self) -> "LevelSolver":
        """Every end of row 0 (the top level's question).

        Only cells that can lie on an optimal pipeline are filled: with ``U*`` the time of
        some complete pipeline (:meth:`upper_bound`), a cell ``(j, m)`` can only if
        ``C(0, j) <= U* below m`` (its own lower bound) and ``C(j, N) <= U* below (K - m)``
        (the rest of the blocks on the rest of the components). Every cell of a pipeline as
        fast as ``U*`` passes both, and so do the best sub-pipelines of its cells, so the
        answer and the choices along it are the same; the other cells stay ``inf``.
        """
        zero = np.zeros(1, dtype=np.int64)
        if self.lower is not None:  # every single stage of the top level starts at block 0
            self.lower.ensure(zero, self.n, band=False)
        if self.bounded and not self.all_starts:
            self.live = self._live_cells(self.upper_bound())
        self.ensure(zero, self.n)
        return self

    def upper_bound(self) -> float:
        """The time of two complete pipelines, the better one: the whole model as one stage
        on all components, and ``min(N, K)`` stages split at equal shares of the compute with
        the components dealt out evenly."""
        n, K = self.n, self.machines
        zero = np.zeros(1, dtype=np.int64)
        best = float(self.single(zero, n, np.array([K]))[0])
        count = min(n, K)
        if count < 2:
            return best
        targets = self.raw[-1] * np.arange(1, count) / count
        ends = [int(e) for e in np.searchsorted(self.raw, targets)]
        for t in range(count - 1):  # strictly increasing, room for the stages after
            ends[t] = min(max(ends[t], (ends[t - 1] if t else 0) + 1), n - (count - 1 - t))
        bounds = np.array([0, *ends, n], dtype=np.int64)
        replicas = np.array([K // count + (1 if t < K % count else 0) for t in range(count)])
        used = np.cumsum(replicas)
        first = float(self.single(zero, int(bounds[1]), replicas[:1])[0])
        rest = self.tail(bounds[1:-1], bounds[2:], replicas[1:], used[1:])
        return min(best, max(first, float(rest.max())))

    def _live_cells(self, bound: float) -> np.ndarray:
        """``[j] -> (lowest, highest) m`` of the cells :meth:`solve` fills."""
        n, K = self.n, self.machines
        live = np.zeros((n + 1, 2), dtype=np.int64)
        live[:, 0], live[:, 1] = 1, 0  # empty
        if not math.isfinite(bound):
            live[:, 1] = K
            return live
        tau = bound * self.scale * (1 + _SLACK)
        slack = _SLACK * (abs(self.raw[-1]) + 1e-300)
        before = self.raw - self.raw[0]
        after = self.raw[-1] - self.raw
        with np.errstate(divide="ignore", invalid="ignore"):
            lowest = np.ceil((before - slack) / tau)
            need_rest = np.where(after > slack, np.maximum(np.ceil((after - slack) / tau), 1), 0)
        live[:, 0] = np.maximum(lowest, 1)
        live[:, 1] = np.where(np.arange(n + 1) == n, K, np.minimum(K - 1, K - need_rest))
        live[n, 0] = max(int(live[n, 0]), K)
        return live

    def ensure(self, starts: np.ndarray, end: int, *, band: bool = True) -> None:
        """Fill the rows ``starts`` (block indices) up to ``end``, each end in turn.

        The rows a level above asks for move along with its end ``j`` (a band of balanced
        stage lengths), so when some row lags by more than one end, every row from it up to
        ``end`` that has been started is brought along too, and so is every row after a row
        started now: one vectorised step per end for the whole band, instead of many steps
        of a few rows each.
        """
        requested = np.unique(starts[starts < end])
        if not self.all_starts:
            assert not len(requested) or (len(requested) == 1 and requested[0] == 0), requested
        rows = requested[self.done[requested] < end]
        if not len(rows):
            return
        behind = rows[self.done[rows] < end - 1]
        if len(behind) and self.all_starts and band:
            near = np.arange(int(behind.min()), end, dtype=np.int64)
            started = (self.done[near] > near) & (self.done[near] < end)
            fresh = behind[self.done[behind] == behind]
            if len(fresh):  # the band moves on: the rows after a new one come next
                started |= near >= fresh.min()
            rows = np.union1d(rows, near[started])
        for j in range(int(self.done[rows].min()) + 1, end + 1):
            active = rows[self.done[rows] < j]
            self._step(active, j)
            self.done[active] = j

    def _step(self, starts: np.ndarray, j: int) -> None:
        """``time[row, j, :]`` for the rows starting at ``starts`` (all ``< j``)."""
        rows = starts if self.all_starts else np.zeros(1, dtype=np.int64)
        live = None
        if self.live is not None:
            lowest, highest = (int(v) for v in self.live[j])
            if lowest > highest:
                return
            live = (self.ms >= lowest) & (self.ms <= highest)
        if self.lower is not None:  # one call for the level below, not one per use
            wanted = [starts]
            if self.bounded:
                on = live[self.pairs.cells - 1] if live is not None else True
                for guess in self._guesses(j, starts):
                    ok = on & (guess > starts[:, None]) & (guess < j)
                    wanted.append(guess[ok])
            self.lower.ensure(np.concatenate(wanted), j)
        single = self.single(starts[:, None], j, self.ms[None, :])  # [row, m - 1]
        pairs = self.pairs
        if len(pairs.m) and j > 1:
            cells = pairs.cells - 1
            on = live[cells] if live is not None else None
            single[:, cells] = np.minimum(single[:, cells],
                                          self._best_split(j, starts, rows, single, on))
        if live is not None:
            single[:, ~live] = np.inf
        self.time[rows, j, 1:] = single

    def _best_split(self, j: int, starts: np.ndarray, rows: np.ndarray,
                    single: np.ndarray, on: np.ndarray | None) -> np.ndarray:
        """``min over (s, m')`` of the candidates, per row and cell ``m`` (``inf``: none, or
        none better than the single stage)."""
        R, C = len(starts), len(self.pairs.cells)
        out = np.full((R, C), np.inf)
        todo = np.ones((R, C), dtype=bool) if on is None else np.broadcast_to(on, (R, C)).copy()
        if self.bounded:
            out = self._split_upper_bound(j, starts, rows, todo)
            todo &= self._not_settled(j, starts, single, out)
        return self._scan_splits(j, starts, rows, single, out, todo)

    def _split_upper_bound(self, j: int, starts: np.ndarray, rows: np.ndarray,
                           todo: np.ndarray) -> np.ndarray:
        """U: the last stage on one component split off where the compute is shared in
        proportion (m - 1) : 1 (the two ``s`` around that share), per row and cell."""
        m = self.pairs.cells[None, :]
        out = np.full(todo.shape, np.inf)
        first, last = starts[:, None] + 1, np.full((1, 1), j - 1)
        if self.straight:
            first = np.maximum(first, starts[:, None] + m - 1)
        first = np.where(todo, first, j)
        for s in self._guesses(j, starts):
            s = np.clip(s, first, last)
            value = np.maximum(self.time[rows[:, None], s, m - 1],
                               self.tail(s, j, np.ones_like(m), m))
            out = np.minimum(out, np.where(first <= last, value, np.inf))
        return out

    def _not_settled(self, j: int, starts: np.ndarray, single: np.ndarray,
                     out: np.ndarray) -> np.ndarray:
        """The cells whose minimum is not known yet: every candidate waits for the transfer
        at its split (min comm[s], i < s < j), so a bound at that floor is the minimum."""
        reverse = np.minimum.accumulate(self.comm[j - 1:0:-1])  # [k] = min comm[j-1-k..j-1]
        floor = np.full(len(starts), np.inf)
        inner = starts <= j - 2
        floor[inner] = reverse[j - 2 - starts[inner]]
        floor = floor[:, None]
        own = single[:, self.pairs.cells - 1]
        result: np.ndarray = (out > floor) & (own > floor)
        return result

    def _scan_splits(self, j: int, starts: np.ndarray, rows: np.ndarray, single: np.ndarray,
                     out: np.ndarray, todo: np.ndarray) -> np.ndarray:
        """Every candidate ``(s, m')`` of the cells in ``todo`` (within the bounds' window),
        folded into ``out``."""
        pairs = self.pairs
        R, C = len(starts), len(pairs.cells)
        cell = self.groups.cell[:R * len(pairs.m)]
        chosen = np.flatnonzero(todo.reshape(-1)[cell])
        if not len(chosen):
            return out
        g_row, g_m, g_mp = (self.groups.row[chosen], self.groups.m[chosen],
                            self.groups.mp[chosen])
        g_start = starts[g_row]
        lo = g_start + 1
        hi = np.full(len(chosen), j - 1, dtype=np.int64)
        if self.straight:  # [i, s) on m - 1 stages needs m - 1 blocks
            lo = np.maximum(lo, g_start + g_m - g_mp)
        if self.bounded:
            upper = np.minimum(out, single[:, pairs.cells - 1])
            limit = upper.reshape(-1)[cell[chosen]] * (1 + _SLACK)
            lo, hi = self._window(j, g_start, g_m, g_mp, limit, lo, hi)
        length = np.maximum(hi - lo + 1, 0)
        total = int(length.sum())
        if total:
            # candidates in group order: (row, m, m', s), so each (row, m) is one run
            g = np.repeat(np.arange(len(chosen)), length)
            offsets = np.cumsum(length) - length
            s = lo[g] + (np.arange(total) - offsets[g])
            m, mp = g_m[g], g_mp[g]
            value = np.maximum(self.time[rows[g_row[g]], s, m - mp], self.tail(s, j, mp, m))
            cell_length = np.bincount(cell[chosen], weights=length, minlength=R * C).astype(np.int64)
            nonempty = np.flatnonzero(cell_length)
            cell_start = (np.cumsum(cell_length) - cell_length)[nonempty]
            flat = out.reshape(-1)
            flat[nonempty] = np.minimum(flat[nonempty], np.minimum.reduceat(value, cell_start))
        return out

    def _guesses(self, j: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[row, cell]``: the two ``s`` around the share ``(m - 1) / m`` of the compute."""
        prefix, m = self.raw, self.pairs.cells[None, :]
        share = prefix[starts][:, None] + (prefix[j] - prefix[starts])[:, None] * ((m - 1) / m)
        guess = np.searchsorted(prefix, share)
        return guess - 1, guess

    def _window(self, j: int, start: np.ndarray, m: np.ndarray, mp: np.ndarray,
                limit: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Narrow ``[lo, hi]`` to the ``s`` whose lower bounds do not exceed ``limit``."""
        prefix = self.raw
        tau = limit * self.scale
        slack = _SLACK * (abs(prefix[-1]) + 1e-300)
        with np.errstate(invalid="ignore"):
            top = prefix[start] + tau * (m - mp) + slack  # C(i, s) <= U below (m - m')
            bottom = prefix[j] - tau * mp - slack  # C(s, j) <= U below m'
        hi = np.minimum(hi, np.searchsorted(prefix, top, side="right") - 1)
        lo = np.maximum(lo, np.searchsorted(prefix, bottom, side="left"))
        if not math.isinf(self.bandwidth):
            # T(s -> j, m') >= AR / m' = 4 (m' - 1) W(s, j) / (m'^2 B below) for m' >= 2
            weights = self.weights
            several = np.flatnonzero(mp > 1)
            if len(several):
                k = mp[several]
                room = limit[several] * (k * k * self.bandwidth * self.below) / (4.0 * (k - 1))
                with np.errstate(invalid="ignore"):
                    bottom = weights[j] - room * (1 + _SLACK) - _SLACK * (abs(weights[-1]) + 1e-300)
                lo[several] = np.maximum(lo[several], np.searchsorted(weights, bottom, side="left"))
        return lo, hi

    # -- choices -------------------------------------------------------------------------

    def choice(self, start: int, end: int, machines: int) -> tuple[int, int]:
        """``(s, m')`` of the last stage cell ``(start, end, machines)`` took; ``s = -1``: the
        whole range as one stage. The first minimum in the recurrence's order (``s``, then
        ``m'``), taken only when strictly better than the single stage; candidates whose
        lower bounds exceed the cell's value cannot be it and are not looked at."""
        assert self.all_starts or start == 0, start
        self.ensure(np.array([start]), end)
        row = start if self.all_starts else 0
        value = self.time[row, end, machines]
        single = float(self.single(np.asarray(start), end, np.asarray(machines)))
        options = self.options(machines)
        if machines == 1 or end == 1 or not len(options) or not value < single:
            return -1, machines
        # every (s, m') inside the windows, s-major
        lo = np.full(len(options), start + 1, dtype=np.int64)
        hi = np.full(len(options), end - 1, dtype=np.int64)
        if self.straight:
            lo = np.maximum(lo, start + machines - 1)
        if self.bounded:
            lo, hi = self._window(end, np.full(len(options), start),
                                  np.full(len(options), machines), options,
                                  np.full(len(options), value * (1 + _SLACK)), lo, hi)
        length = np.maximum(hi - lo + 1, 0)
        which = np.repeat(np.arange(len(options)), length)
        s = lo[which] + (np.arange(int(length.sum())) - (np.cumsum(length) - length)[which])
        order = np.lexsort((which, s))
        s, mp = s[order], options[which[order]]
        candidate = np.maximum(self.time[row, s, machines - mp],
                               self.tail(s, end, mp, np.asarray(machines)))
        hits = np.flatnonzero(candidate == value)
        assert len(hits), (start, end, machines)
        return int(s[hits[0]]), int(mp[hits[0]])
