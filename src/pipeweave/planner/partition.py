"""Contiguous partitions of a block list: equal counts, and the min-max dynamic program.

A partition of ``n`` blocks into ``p`` stages is given by its bounds
``[(0, e1), (e1, e2), ..., (e_{p-1}, n)]`` (half-open block ranges, each non-empty).

:func:`min_max_partition` is AutoPipe's Algorithm 1 (autopipe.txt §III-B): with prefix sums
``S`` of the block weights, ``time[i][j]`` is the smallest possible heaviest stage when the
first ``i`` blocks form ``j`` stages::

    time[i][1] = S[i]
    time[i][j] = min over k < i of max(time[k][j-1], S[i] - S[k])

It is also how torchgpipe balances by time and DeepSpeed by parameters (the same min-max
objective on other weights). Each stage count ``j`` is one vectorised step over the matrix of
``(i, k)`` pairs, so 1,000 blocks onto 64 stages takes a fraction of a second. Ties keep the
smallest ``k`` (the first minimum, as the printed loop does), i.e. the latest stages take
as many blocks as the optimum allows.

An optional ``feasible(j)`` mask (``[k, i]`` -> stage ``j`` may hold blocks ``k..i-1``) adds
per-stage constraints such as a memory limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .min_max_table import backtrack, dp_step, span_matrix, table_for

__all__ = ["Bounds", "uniform_partition", "min_max_partition", "stage_sums", "check_stages"]

Bounds = tuple[tuple[int, int], ...]
"""Half-open ``(start, end)`` block range of every stage, in order."""

FeasibleFn = Callable[[int], "np.ndarray"]
"""``feasible(j)``: boolean ``[n+1, n+1]`` matrix, ``[k, i]`` true when 0-based stage ``j``
may hold blocks ``k .. i-1``."""


def check_stages(num_blocks: int, stages: int) -> None:
    """Reject a stage count that no partition can meet."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"the number of stages must be an integer >= 1, got {stages!r}")
    if stages > num_blocks:
        raise ValueError(
            f"cannot split {num_blocks} blocks into {stages} stages: every stage needs at least "
            f"one block; use at most {num_blocks} stages (or a finer-grained model, e.g. GPT "
            "with sublayer=True)"
        )


def uniform_partition(num_blocks: int, stages: int) -> Bounds:
    """Equal block counts, the first ``num_blocks % stages`` stages one block longer."""
    check_stages(num_blocks, stages)
    base, extra = divmod(num_blocks, stages)
    bounds, start = [], 0
    for index in range(stages):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return tuple(bounds)


def stage_sums(weights: Sequence[float], bounds: Bounds) -> list[float]:
    """Total weight of every stage."""
    return [float(sum(weights[a:b])) for a, b in bounds]


def min_max_partition(
    weights: Sequence[float], stages: int, *, feasible: FeasibleFn | None = None,
    end: int | None = None,
) -> tuple[Bounds, float]:
    """Algorithm 1: the partition into ``stages`` stages minimising the heaviest stage.

    Returns the bounds and the heaviest stage's weight. ``end``: split only blocks
    ``0 .. end - 1`` (default: all). Without ``feasible`` the program's choices are kept
    per weight list and reused (:mod:`.min_max_table`, the same bounds to the bit). Raises
    ``ValueError`` when ``feasible`` leaves no partition.
    """
    n = len(weights) if end is None else end
    if not 0 <= n <= len(weights):
        raise ValueError(f"end {end} is outside the {len(weights)} blocks; give 1 .. "
                         f"{len(weights)} or None")
    check_stages(n, stages)
    table = table_for(weights) if feasible is None else None
    if table is not None:
        result = table.bounds(stages, n)
    else:
        result = _min_max_program(np.asarray(weights[:n], dtype=float), stages, feasible)
    return result, float(max(stage_sums(weights, result)))


def _min_max_program(weights: np.ndarray, stages: int,
                     feasible: FeasibleFn | None) -> Bounds:
    """The program run afresh (module docstring); rows are the end ``i``, so the minimum
    over ``k`` runs along contiguous memory."""
    n = len(weights)
    span = span_matrix(weights)
    time = span[:, 0].copy()  # time[i] for one stage: blocks 0 .. i-1
    if feasible is not None:
        time = np.where(feasible(0)[0], time, np.inf)
    candidate = np.empty_like(span)
    choices: list[np.ndarray] = []
    for j in range(1, stages):
        time, best = dp_step(time, span, candidate,
                             None if feasible is None else ~feasible(j).T)
        choices.append(best)
    if not np.isfinite(time[n]):
        raise ValueError(
            f"no partition of {n} blocks into {stages} stages satisfies the constraints (e.g. "
            "the memory limit); raise the limit or use more stages"
        )
    return backtrack(choices, n)
