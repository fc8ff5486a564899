"""What the columns of a rank's passes mean, and the closed-form orders that fill them.

:mod:`.flush_arrays` (the programs of one pipeline copy), :mod:`.copy_orders` and
:mod:`.steady_orders` (the list-scheduled orders) lay out passes as integer columns: an op
code (``OPS[code]``), a stage and a micro-batch. The 1F1B pattern of a rank's run of ``n``
passes, which GPipe, 1F1B and Megatron's interleaved order share, is here too (``k``-th
forward, ``k``-th backward)::

    F0 .. F(w-1) | F(w) B0  F(w+1) B1 .. F(n-1) B(n-w-1) | B(n-w) .. B(n-1)
      warm-up w           one forward, one backward            cool-down
"""

from __future__ import annotations

import numpy as np

from ..ir import Op

__all__ = ["OPS", "Rows", "F", "B", "AR", "U", "I", "W", "AV", "PASSES", "pattern",
           "interleaved_rows"]

OPS = (Op.FORWARD, Op.BACKWARD, Op.ALL_REDUCE, Op.STEP, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT,
       Op.AVERAGE)
"""What an op code in the columns means: ``OPS[code]``."""

F, B, AR, U, I, W, AV = range(7)
PASSES = (F, B, I, W)
"""The codes of a micro-batch's computation (``F``, ``B``, ``I``, ``W``)."""

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One rank's passes of one iteration: op codes, stages, micro-batches (0-based within the
iteration and the copy)."""


def pattern(n: int, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """``(is_forward, k)`` of the module docstring's pattern for ``n`` passes."""
    w = min(warmup, n)
    pairs = n - w
    steady = np.stack([np.arange(w, n), np.arange(pairs)], axis=1).reshape(-1)
    k = np.concatenate([np.arange(w), steady, np.arange(pairs, n)])
    forward = np.concatenate([np.ones(w, bool), np.tile([True, False], pairs),
                              np.zeros(w, bool)])
    return forward, k


def interleaved_rows(P: int, v: int, M: int, rank: int) -> Rows:
    """:func:`~pipeweave.schedules.interleaved.interleaved_order` of ``rank`` (``v >= 2``
    chunks, ``M`` a multiple of ``P``): Megatron's warm-up, ``k`` mapped to a chunk and a
    micro-batch by that function's rule."""
    total, group = M * v, P * v
    forward, k = pattern(total, (P - rank - 1) * 2 + (v - 1) * P)
    chunk = (k % group) // P
    chunk = np.where(forward, chunk, v - 1 - chunk)
    return np.where(forward, F, B), chunk * P + rank, (k // group) * P + k % P
