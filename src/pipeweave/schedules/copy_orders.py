"""The list-scheduled copy orders as numpy columns, built without a pass record each.

:mod:`.flush_arrays` lays out the synchronous schedules of one pipeline copy as columns. The
orders found by list scheduling (ZB-V, V-Min, V-Half, DualPipeV, interleaved ZB) come from an
order function that builds ``6MP`` pass tuples in Python (seconds at 128 ranks x 1,024
micro-batches, and the search asks for tens of such shapes). Here each is laid out as columns
``(op code, stage, i)`` per rank, the same passes in the same order:

* V-Min and V-Half (:func:`~pipeweave.schedules.v_blocks.block_order`): every pass of
  micro-batch ``i`` at its block time plus ``6i``; a rank's six passes of the block have six
  different residues mod 6, so its times are all different and one ``argsort`` is the order;
* DualPipeV (:func:`~pipeweave.schedules.dualpipev.dualpipev_order`): its eight phases as runs
  of (op, chunk) tokens, the steady phase 4 tiled, then each token's micro-batch counted per
  op and chunk (a chunk's forwards, and its backwards, go in micro-batch order) and each ``W``
  matched with the ``I`` it follows (the oldest owed first);
* ZB-V and interleaved ZB: :mod:`.steady_orders` (their steady state repeated).

``tests/schedules/test_copy_orders.py`` compares every one with its order function, pass for
pass, on many shapes. Orders are kept per ``(order, P, M)``: the floor (one iteration) and the
timing (several) of a shape, and every partition of it, share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .common import Pass
from .dualpipev import dualpipev_order
from .interleaved_zb import interleaved_zb_order
from .pass_columns import OPS, Rows
from .pass_columns import B as _B, F as _F, I as _I, W as _W
from .steady_orders import interleaved_zb_rows, zbv_rows
from .v_blocks import PERIOD, Block, building_block, _v_half_order, _v_min_order
from .zbv import zbv_order

__all__ = ["Rows", "copy_rows", "passes_rows"]


def copy_rows(order: object, P: int, M: int, chunks: int) -> tuple[Rows, ...]:
    """The passes ``order(P, M)`` gives (``interleaved_zb_order(P, M, chunks)`` for that
    order), per rank as columns (module docstring); remembered for the last 8 shapes."""
    return _rows(order, P, M, chunks)


@lru_cache(maxsize=8)  # 6MP passes each: 128 ranks x 4,096 micro-batches, some 40 MB
def _rows(order: object, P: int, M: int, chunks: int) -> tuple[Rows, ...]:
    rows = _laid_out(order, P, M, chunks)
    for row in rows:
        for column in row:
            column.flags.writeable = False
    return rows


def _laid_out(order: object, P: int, M: int, chunks: int) -> tuple[Rows, ...]:
    if order is _v_min_order:
        return _block_rows(building_block(P, 0), P, M)
    if order is _v_half_order:
        return _block_rows(building_block(P, 1), P, M)
    if order is dualpipev_order:
        if M < 2 * P:
            dualpipev_order(P, M)  # raises its own error: M >= 2P
        return tuple(_dualpipev_rows(P, M, r) for r in range(P))
    if order is zbv_order:
        return zbv_rows(P, M)
    if order is interleaved_zb_order:
        return interleaved_zb_rows(P, M, chunks)
    raise ValueError(f"no columns for the order {order!r}; pass one of zbv_order, "
                     "dualpipev_order, interleaved_zb_order or the V blocks' orders")


def passes_rows(passes: Sequence[Pass]) -> Rows:
    """One rank's :data:`~pipeweave.schedules.common.Pass` tuples as columns."""
    n = len(passes)
    code = {op: OPS.index(op) for op in OPS}
    return (np.fromiter((code[p[0]] for p in passes), np.int64, n),
            np.fromiter((p[1] for p in passes), np.int64, n),
            np.fromiter((p[2] for p in passes), np.int64, n))


def _block_rows(block: Block, P: int, M: int) -> tuple[Rows, ...]:
    """:func:`~pipeweave.schedules.v_blocks.block_order` (module docstring)."""
    last = 2 * P - 1
    rows = []
    for rank in range(P):
        mine = [(op, stage, start) for (op, stage), start in block.items()
                if min(stage, last - stage) == rank]
        code = np.array([OPS.index(op) for op, _, _ in mine], dtype=np.int64)
        stage = np.array([s for _, s, _ in mine], dtype=np.int64)
        times = np.array([t for _, _, t in mine], dtype=np.int64)[:, None] \
            + PERIOD * np.arange(M)[None, :]
        order = np.argsort(times, axis=None, kind="stable")
        which, micro = np.divmod(order, M)
        rows.append((code[which], stage[which], micro))
    return tuple(rows)


_F0, _F1, _B0, _B1, _I0, _I1, _WX = range(7)
"""DualPipeV's tokens: a forward, whole backward or input gradient of chunk 0/1; a ``W``."""


def _dualpipev_tokens(P: int, M: int, r: int) -> np.ndarray:
    """Rank ``r``'s (op, chunk) tokens in :func:`~pipeweave.schedules.dualpipev._rank_order`'s
    eight phases (phase 4 tiled: it is the only one whose length grows with ``M``)."""
    down = P - 1 - r
    head = [_F0] * (2 * down) + [_F0, _F1] * (r + 1) + [_I1, _WX, _F1] * down
    steady = np.tile(np.array([_F0, _B1, _F1, _B0], dtype=np.int64), M - 2 * P + r + 1)
    tail = [_B1, _F1, _B0] * down
    split, owed, middle = False, 0, (r + 1) // 2
    for step in range(r + 1):  # 6: B1 B0, split from the middle on
        split = split or (step == middle and r % 2 == 1)
        tail.append(_I1 if split else _B1)
        owed += split
        split = split or (step == middle and r % 2 == 0)
        tail.append(_I0 if split else _B0)
        owed += split
    for _ in range(down):  # 7: W I0 (the W only while one is owed)
        if owed:
            tail.append(_WX)
            owed -= 1
        tail.append(_I0 if split else _B0)
        owed += split
    tail.extend([_WX] * owed)  # 8
    return np.concatenate([np.array(head, dtype=np.int64), steady,
                           np.array(tail, dtype=np.int64)])


def _dualpipev_rows(P: int, M: int, r: int) -> Rows:
    """Rank ``r``'s passes: each token's micro-batch counted per op and chunk, each ``W``
    the stage and micro-batch of the ``I`` it follows (oldest owed first)."""
    tokens = _dualpipev_tokens(P, M, r)
    chunk = np.isin(tokens, (_F1, _B1, _I1)).astype(np.int64)
    forward = (tokens == _F0) | (tokens == _F1)
    gradient = ~forward & (tokens != _WX)
    split = (tokens == _I0) | (tokens == _I1)
    micro = np.zeros(len(tokens), dtype=np.int64)
    for kind in (forward, gradient):
        for c in (0, 1):
            mask = kind & (chunk == c)
            micro[mask] = np.arange(int(mask.sum()))
    stages = np.array([r, 2 * P - 1 - r], dtype=np.int64)
    stage = stages[chunk]
    weights = tokens == _WX
    owed = np.flatnonzero(split)[:int(weights.sum())]
    stage[weights], micro[weights] = stage[owed], micro[owed]
    code = np.where(forward, _F, np.where(weights, _W, np.where(split, _I, _B)))
    return code, stage, micro
