"""What a Slicer half costs: the one pricing rule the walk and the compiled walk share.

AutoPipe's Slicer (``sliced-1f1b``) forwards a micro-batch in two halves, pieces ``a`` and
``b``; the runtime then back-propagates each half on its own inside the micro-batch's one
``B`` (``StageRuntime.backward``), so that ``B`` runs two half backwards::

    F, piece a or b                      half_forward[s]
    B (I, W) of a sliced micro-batch     2 half_backward[s]   (2 half_input_grad[s], ...)
    any other action                     its whole cost

With no half costs given (:attr:`StageCosts.explicit_halves` false) a half costs half the
whole and a sliced micro-batch's ``B`` the whole ``B``: the numbers from before half costs
existed, to the last bit. On a real device a half costs more than half the whole (each call
pays a fixed cost); the planner gives the profile's times at half the micro-batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir import Action, Op
from .costs import StageCosts

__all__ = ["sliced_keys", "half_tables", "piece_factor", "factored_durations",
           "HALF", "TWO_HALVES"]

HALF, TWO_HALVES = 0.5, 2.0
"""Duration factors a compiled schedule records: a Slicer half, and a whole backward (B, I
or W) of a micro-batch whose forward ran in halves."""

_BACKWARDS = (Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)

Key = tuple[int, int | None, int]
"""(stage, micro-batch, pipeline) of a micro-batch forwarded in halves on that stage."""


def sliced_keys(programs: Sequence[Sequence[Action]]) -> frozenset[Key]:
    """The micro-batches each stage forwards in halves (``piece`` 1 or 2)."""
    return frozenset((a.stage, a.microbatch, a.pipeline) for program in programs
                     for a in program if a.op is Op.FORWARD and a.piece)


def half_tables(costs: StageCosts) -> dict[Op, tuple[float, ...]]:
    """Per op, what one half costs per stage (explicit half costs only)."""
    assert costs.explicit_halves
    return {Op.FORWARD: costs.half_forward, Op.BACKWARD: costs.half_backward,
            Op.BACKWARD_INPUT: costs.half_input_grad, Op.BACKWARD_WEIGHT: costs.half_weight_grad}


def piece_factor(programs: Sequence[Sequence[Action]]) -> Callable[[Action], float]:
    """Each action's duration factor for :func:`factored_durations`: :data:`HALF`,
    :data:`TWO_HALVES` or 1."""
    sliced = sliced_keys(programs)

    def factor(action: Action) -> float:
        if action.piece:
            return HALF
        if sliced and action.op in _BACKWARDS and \
                (action.stage, action.microbatch, action.pipeline) in sliced:
            return TWO_HALVES
        return 1.0

    return factor


def factored_durations(costs: StageCosts, table: np.ndarray, row: np.ndarray,
                       stage: np.ndarray, factor: np.ndarray,
                       rows: Sequence[Op]) -> np.ndarray:
    """Every action's duration from its cost ``table[row, stage]`` and its ``factor``
    (module docstring); ``rows``: the op of each row of ``table``."""
    whole = table[row, stage]
    if not costs.explicit_halves:
        return whole * np.minimum(factor, 1.0)  # t * 0.5 or t, as the walk
    half = table * 0.5
    for i, op in enumerate(rows):
        values = half_tables(costs).get(op)
        if values is not None:
            half[i, :len(values)] = values
    halves = half[row, stage]
    return np.where(factor == HALF, halves, np.where(factor == TWO_HALVES, 2 * halves, whole))
