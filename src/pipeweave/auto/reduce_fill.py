"""The fill and drain with every stage's own all-reduce, in a bound valid on every split.

:mod:`~pipeweave.auto.fill_bound` closes every stage's chain with the first stage's
all-reduce, at least block 0's. Where the replicas of a stage cross a slow level, each
stage's all-reduce is long, and a stage can only start it after its own last backward; the
split that would balance the fill then leaves some stage's all-reduce exposed. This module
bounds ``T >= max_s (end of s's last backward + AR_s)`` together with the fill, minimised
over every split, for the schedules whose waits :data:`~pipeweave.auto.fill_bound.WINDOWS`
declares (one stage per rank, backwards whole, the last compute of a stage its last
backward).

**Per stage.** With the notation of :mod:`~pipeweave.auto.fill_bound` (``c_s = f_s + b_s``
per micro-batch, ``Q_s`` the work behind ``s``, ``P_s`` in front, windows ``k_s``,
``j_s``, ``m_s = max(k_s - 1, j_s)``, ``a_s = n - 1 - m_s``), stage ``s`` starts after
micro-batch 0's forwards in front, at least ``phi P_s`` (``phi``: the least ``f / c`` of a
block), runs ``n c_s``, idles at least ``f_s + Q_s - k_s f_s`` before its first backward and
``Q_s - j_s b_s`` before its last, then all-reduces and updates (``AR_s``)::

    (S)  T >= phi C + (2 - phi) Q_s + (a_s + 1 - phi) c_s + AR_s
    (A)  T >= C + Q_s + a_s c_s + AR_0        (fill_bound's form A, closed by stage 0)
    (W)  T >= n c_s + AR_s                    (its rank's work)

An all-reduce is linear in the stage's bytes, ``AR_s = kappa_s |w_s|`` (``kappa_s`` per byte,
at the link the replicas of ``s`` cross, :func:`~pipeweave.auto.links.replica_bandwidths`),
and every run of ``k`` consecutive blocks holds at least ``pi_k`` bytes per second of its
work (``pi_k`` the least such ratio; a tie's bytes are taken off each block holding it), so
a stage, ``floor(m / k)`` such runs and a shorter rest, holds at least ``pi_k c_s - delta_k``
(``delta_k`` the most any run of fewer than ``k`` blocks falls short of ``pi_k`` times its
work; :func:`contiguous_shares`, ``k`` = 1, 2, 4: an attention block alone holds less per
second than a layer). Hence ``AR_s >= y_s + kappa_s pi_k c_s`` with
``y_s = -kappa_s delta_k``, except that stage 0 holds block 0 and the last stage the last
block, then a run: ``y = kappa (|w_b| - pi_k c_b - delta_k) + U_b`` there; and
``AR_0 >= kappa_0 |w_0| + U_0`` whatever ``c_0`` is. Each ``k`` gives its own constraints.
Every right-hand side grows with every action's duration (the coefficients of ``f_s`` and
``b_s`` are ``n - k_s + 1`` and ``n - j_s``, both positive), so recomputation, a sharded
candidate's gathers, shared cores' slowdowns or a measured runtime only raise it: the bound
holds for them with the profile's costs.

**The least over every split.** Each constraint reads ``alpha q + gamma c <= R - const``
(``q = Q_s``, ``c = c_s``) with ``gamma >= alpha`` (``a_s >= 1``), so
``q_{s-1} = q_s + max(0, min over the constraints of (R - const - alpha q_s) / gamma)`` is
non-decreasing in ``q_s``: walking from the last stage and taking each ``c_s`` as large as
allowed reaches at least the ``Q`` of any split that meets every constraint at ``R``. If
the walk's total stays below ``C``, no split runs in ``R``: the bound is the largest ``R``
a grid search finds infeasible. ``C`` is the profile's work per micro-batch; transfers and
latencies are left out (they only lengthen the chains). ``tests/auto/test_reduce_fill.py``
checks it against the simulator on every split of random blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .fill_bound import SAFETY, WINDOWS

__all__ = ["Blocks", "contiguous_shares", "reduce_fill_bound"]

_GRID = 64
_ROUNDS = 4


@dataclass(frozen=True)
class Blocks:
    """What the bound needs of the blocks (per micro-batch, the profile's costs)."""

    work: float
    """``C``: the sum over blocks of ``f + min(B, I + W)``."""
    forward_share: float
    """``phi``: the least ``f / (f + min(B, I + W))`` of a block."""
    shares: tuple[tuple[float, float], ...]
    """``(pi_k, delta_k)``: every run of consecutive blocks holds at least ``pi_k`` times
    its work less ``delta_k`` parameter bytes (:func:`contiguous_shares`)."""
    first: tuple[float, float, float]
    """Block 0's work, parameter bytes (a tie's taken off) and update."""
    last: tuple[float, float, float]
    """The last block's, the same."""


def contiguous_shares(work: list[float], held: list[float], spans: tuple[int, ...] = (1, 2, 4)
                      ) -> tuple[tuple[float, float], ...]:
    """Per ``k`` in ``spans``: ``(pi_k, delta_k)`` (module docstring) of blocks with these
    works and parameter bytes: every run of consecutive blocks holds at least
    ``pi_k * its work - delta_k`` bytes."""
    works = np.concatenate([[0.0], np.cumsum(work)])
    helds = np.concatenate([[0.0], np.cumsum(held)])
    out = []
    for k in spans:
        if k > len(work):
            continue
        run_work, run_held = works[k:] - works[:-k], helds[k:] - helds[:-k]
        positive = run_work > 0
        pi = float(np.min(run_held[positive] / run_work[positive])) if positive.any() else 0.0
        short = max((float(np.max(pi * (works[j:] - works[:-j]) - (helds[j:] - helds[:-j])))
                     for j in range(1, k)), default=0.0)
        out.append((pi, max(short, 0.0)))
    return tuple(out)


def reduce_fill_bound(schedule: str, n: int, blocks: Blocks,
                      per_byte: tuple[float, ...]) -> float:
    """The least over every split into ``len(per_byte)`` stages of the chains above
    (module docstring); ``per_byte[s]``: seconds per parameter byte of stage ``s``'s
    all-reduce. 0 for a schedule without declared windows or a shape form A does not
    cover."""
    stages = len(per_byte)
    if schedule not in WINDOWS or stages < 2 or n < 2 or blocks.work <= 0:
        return 0.0
    return _bound(schedule, n, blocks, per_byte)


@lru_cache(maxsize=2048)
def _bound(schedule: str, n: int, blocks: Blocks, per_byte: tuple[float, ...]) -> float:
    rows = _constraints(schedule, n, blocks, per_byte)
    if rows is None:
        return 0.0
    const, alpha, gamma = rows
    # a split that meets every constraint: the balanced one
    stages = len(per_byte)
    c = blocks.work / stages
    q = blocks.work - c * np.arange(1, stages + 1)[:, None]  # Q_s, first stage first
    low, high = 0.0, float(np.max(const + alpha * q + gamma * c))
    for _ in range(_ROUNDS):
        grid = np.linspace(low, high, _GRID)
        feasible = _reached(grid, const, alpha, gamma) >= blocks.work
        first = int(np.argmax(feasible)) if feasible.any() else _GRID - 1
        if first == 0:
            break
        low, high = float(grid[first - 1]), float(grid[first])
    return low * (1.0 - SAFETY)


def _constraints(schedule: str, n: int, blocks: Blocks, per_byte: tuple[float, ...]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per stage (rows, first stage first) and constraint (S, A, W per ``k``): ``const``, ``alpha``
    and ``gamma`` of ``alpha q + gamma c <= R - const``; None where form A does not hold."""
    stages = len(per_byte)
    windows = [WINDOWS[schedule](s, stages, n) for s in range(stages)]
    slopes = np.array([n - 1 - max(k - 1, j) for k, j in windows], dtype=float)
    if any(k >= n for k, _ in windows) or slopes.min() < 1:
        return None
    work, phi = blocks.work, blocks.forward_share
    kappa = np.array(per_byte, dtype=float)
    closing = kappa[0] * blocks.first[1] + blocks.first[2]  # AR_0 on every split
    rows = [(np.full(stages, work + closing), 1.0, slopes)]
    for pi, delta in blocks.shares:
        beta = kappa * pi
        y = -kappa * delta
        for s, (block_work, block_bytes, update) in ((0, blocks.first), (-1, blocks.last)):
            y[s] += kappa[s] * (block_bytes - pi * block_work) + update
        form_a = np.full(stages, work + closing)
        form_a[0] = work + y[0]
        slope_a = slopes.copy()
        slope_a[0] += beta[0]
        rows += [(phi * work + y, 2.0 - phi, slopes + 1.0 - phi + beta),
                 (form_a, 1.0, slope_a), (y, 0.0, n + beta)]
    const = np.stack([r[0] for r in rows], axis=1)
    alpha = np.broadcast_to(np.array([r[1] for r in rows]), const.shape)
    gamma = np.stack([r[2] for r in rows], axis=1)
    return const, alpha, gamma


def _reached(limits: np.ndarray, const: np.ndarray, alpha: np.ndarray,
             gamma: np.ndarray) -> np.ndarray:
    """Per iteration time ``R`` in ``limits``: the most work the greedy walk from the last
    stage places (module docstring)."""
    q = np.zeros_like(limits)
    for s in range(const.shape[0] - 1, -1, -1):
        room = (limits[:, None] - const[s] - alpha[s] * q[:, None]) / gamma[s]
        q = q + np.maximum(room.min(axis=1), 0.0)
    return q
