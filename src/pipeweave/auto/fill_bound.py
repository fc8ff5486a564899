"""The pipeline's fill and drain in a lower bound that holds for every split (no partition).

:func:`~pipeweave.auto.bounds.shape_bound` minimises one chain per stage over a continuous
split and gives about half of 1F1B's ``(S - 1) / n`` bubble: the split that equalises its
chains puts more work on the early stages. Here each stage's chain also counts the time
its rank must wait, from what the schedule's order declares (:data:`WINDOWS`, read off the
generator; ``tests/auto/test_fill_bound.py`` checks the declared counts on the generated
schedules and the bound against the simulator on random cost tables).

**One stage per rank, backwards whole.** Stage ``s`` of ``S`` runs ``n`` forwards ``f_s``
and ``n`` backwards ``b_s`` (``c_s = f_s + b_s``, ``C = sum_s c_s``), one after another on
its rank. With ``P_s`` and ``Q_s`` the sums of ``c_t`` over the stages before and after
``s``:

- it starts no earlier than ``head(s) >= sum_{t<s} f_t`` (micro-batch 0's forwards), and
  after its last backward that micro-batch's gradient still crosses the stages in front,
  ``sum_{t<s} b_t``, then stage 0 all-reduces and updates (``closing``, at least block 0's);
- a micro-batch's backward on ``s`` starts at least ``down(s) >= Q_s`` after its forward
  there ends (its forwards and backwards on every later stage);
- window 1, from the stage's start to its first backward, lasts at least ``f_s + Q_s``
  and holds at most ``k_s`` forwards and nothing else; window 2, from the end of its last
  forward to the start of that micro-batch's backward, lasts at least ``Q_s`` and holds at
  most ``j_s`` backwards and nothing else. With ``k_s < n`` the last forward comes after the
  first backward, so the windows do not overlap, and their idle time adds::

      T >= head(s) + n c_s + (f_s + Q_s - k_s f_s) + (Q_s - j_s b_s) + closing(s)
        >= C + Q_s + a_s c_s,       a_s = n - 1 - max(k_s - 1, j_s)          (form A)

  (``P_s + c_s + Q_s = C``; ``(k_s - 1) f_s + j_s b_s <= max(k_s - 1, j_s) c_s``); window 2
  alone gives ``T >= C + (n - 1 - j_s) c_s`` (form B), with no condition on ``k_s``.

**The least over every split.** Blocks are indivisible, so the least over real splits is at
least the least over continuous ones, ``c_s >= 0`` summing to ``C``. Form A with every
``a_s >= 1``: ``T = C + R`` is reachable iff some split has ``Q_s + a_s c_s <= R`` for all
``s``; walking from the last stage, ``q_{s-1} = q_s + c_s <= q_s (1 - 1/a_s) + R / a_s`` is
non-decreasing in ``q_s``, so taking each ``c_s`` as large as allowed maximises the total,
``R K`` with ``1 - K = prod_s (1 - 1 / a_s)``, hence::

    T >= C + C / K + closing                     (form A)
    T >= C + C / sum_s 1 / (n - 1 - j_s) + closing   (form B: c_s <= R / (n - 1 - j_s))

1F1B declares ``k_s = S - s``, ``j_s = S - s - 1`` (its warm-up), so ``a_s = n - S + s``,
the product telescopes to ``(n - S - 1) / (n - 1)`` and form A is ``(n + S - 1) C / S``:
the 1F1B time of a perfectly balanced split, which therefore is the best split (for
``n > S``). Transfers, latencies and recomputation are left out (they only lengthen the
chains) and ``C`` is the profile's work per micro-batch, so the bound stays below every
split the partition methods can make. A schedule not in :data:`WINDOWS` gets 0 (no bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

__all__ = ["WINDOWS", "fill_bound", "SAFETY"]

SAFETY = 1e-12
"""The bound is this fraction below the closed form: the product is summed as logarithms."""

Windows = Callable[[int, int, int], tuple[int, int]]
"""``windows(stage, stages, n)``: ``(k, j)``, the most forwards stage ``stage`` runs before
its first backward, and the most backwards it runs between the end of its last forward and
the start of that micro-batch's backward (``n`` micro-batches per copy)."""

WINDOWS: dict[str, Windows] = {
    "1f1b": lambda s, S, n: (min(n, S - s), min(n - 1, S - s - 1)),
    "avgpipe": lambda s, S, n: (min(n, S - s), min(n - 1, S - s - 1)),
}
"""Per schedule of one stage per rank whose backwards are whole: its declared windows
(module docstring; ``common.one_f_one_b_order``: a warm-up of ``S - s - 1`` forwards, then
forward-backward pairs; AvgPipe's one pipeline without ``advance``, the same order).
:func:`~pipeweave.auto.bounds.shape_bound` asks it only for a candidate of one pipeline and
no options.)"""


def fill_bound(schedule: str, stages: int, n: int, work: float) -> float:
    """The least over every split of ``work`` (``C``, one micro-batch through every stage)
    into ``stages`` stages of the chains above, without ``closing`` (module docstring); 0
    for a schedule without declared windows or a shape neither form covers."""
    if schedule not in WINDOWS or stages < 1 or n < 2 or work <= 0:
        return 0.0
    return work * (1.0 + _factor(schedule, stages, n)) * (1.0 - SAFETY)


@lru_cache(maxsize=4096)
def _factor(schedule: str, stages: int, n: int) -> float:
    """``1 / K`` of form A or ``1 / sum 1 / (n - 1 - j_s)`` of form B, the larger (0: none)."""
    windows = [WINDOWS[schedule](s, stages, n) for s in range(stages)]
    best = 0.0
    spans = [n - 1 - j for _, j in windows]
    if all(span >= 1 for span in spans):
        best = 1.0 / sum(1.0 / span for span in spans)
    slopes = [n - 1 - max(k - 1, j) for k, j in windows]
    if all(k < n for k, _ in windows) and all(a >= 1 for a in slopes):
        # 1 - K as a sum of logarithms: a product of hundreds of factors near 1
        left = 0.0 if min(slopes) == 1 else math.exp(sum(math.log1p(-1.0 / a) for a in slopes))
        if left < 1.0:
            best = max(best, 1.0 / (1.0 - left))
    return best
