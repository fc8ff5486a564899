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
    weights: Sequence[float], stages: int, *, feasible: FeasibleFn | None = None
) -> tuple[Bounds, float]:
    """Algorithm 1: the partition into ``stages`` stages minimising the heaviest stage.

    Returns the bounds and the heaviest stage's weight. Raises ``ValueError`` when
    ``feasible`` leaves no partition.
    """
    n = len(weights)
    check_stages(n, stages)
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(weights, dtype=float))))
    inf = np.inf
    # span[i, k] = S[i] - S[k], the weight of blocks k .. i-1; inf where k >= i (not a stage).
    # Rows are the end i, so the minimum over k runs along contiguous memory.
    span = prefix[:, None] - prefix[None, :]
    span[np.triu_indices(n + 1)] = inf
    time = span[:, 0].copy()  # time[i] for one stage: blocks 0 .. i-1
    if feasible is not None:
        time = np.where(feasible(0)[0], time, inf)
    rows = np.arange(n + 1)
    candidate = np.empty_like(span)
    choices: list[np.ndarray] = []
    for j in range(1, stages):
        np.maximum(time[None, :], span, out=candidate)  # [i, k]: stages so far end at k
        if feasible is not None:
            candidate[~feasible(j).T] = inf
        best = np.argmin(candidate, axis=1)  # first minimum: smallest k
        time = candidate[rows, best]
        choices.append(best)
    if not np.isfinite(time[n]):
        raise ValueError(
            f"no partition of {n} blocks into {stages} stages satisfies the constraints (e.g. "
            "the memory limit); raise the limit or use more stages"
        )
    bounds = []
    end = n
    for best in reversed(choices):
        start = int(best[end])
        bounds.append((start, end))
        end = start
    bounds.append((0, end))
    bounds.reverse()
    result = tuple(bounds)
    return result, float(max(stage_sums(weights, result)))
