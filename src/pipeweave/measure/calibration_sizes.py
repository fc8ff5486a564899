"""What each compute action of a distributed run costs beyond its profiled blocks, fitted from
the calibration's two data-parallel plans at two micro-batch sizes.

The profiler times each block alone, the same input again and again; the single-process
runtime costs (:mod:`pipeweave.profiler.runtime_costs`) add what one action of the runtime
costs in one process. On the timelines of real distributed runs the F and B actions cost a
fixed amount more per action, whatever their size (measured 2026-11-27 on gpt-small, 2 ranks,
the 1F1B uniform split, a shared and loaded machine, median ms per action against the
profile's blocks: F 53 / 28 / 21 at 4 / 2 / 1 samples against 23 / 6.6 / 4.1, B 76 / 35 / 25
against 38 / 11 / 6.2; quiet, ``benchmarks/results/auto_predict_gpt_small.json``: 1F1B at
M = 8 computed 0.385 s per iteration where 0.125 s was simulated, the default at M = 4 0.344
where 0.294). One compute scale, fitted at the default's micro-batch, therefore prices
smaller micro-batches fast, and the search, which picks the most optimistic prediction, chose
them (gpt-small's winners predicted 28-64 % fast).

The calibration's ``data-parallel`` and ``data-parallel-small`` plans are the same plan (the
whole model on every rank) at the default's M and at the largest M the search tries: every
rank busy alike, only the micro-batch size and the number of actions differ. In one round
both run under the same load, so their compute summed over ranks is ``C = s (S + n k)``
with one scale ``s``: ``S`` the simulated compute without ``k``, ``n`` the compute actions
per iteration. Two plans give ``k`` in closed form::

    k = (C2 S1 - C1 S2) / (C1 n2 - C2 n1)

(plan 1 the larger micro-batches), at least 0; the fitted ``compute_per_action`` is the
median over the rounds, ``RuntimeCosts.compute_per_action``: added to every F, B, I and W
after the single-process fixed costs (and their floor at a tenth of the blocks, which the
single-process fit's negative ``per_block`` reached at small micro-batches: 18 blocks at one
sample), inside the compute that ``compute_scale`` multiplies
(:func:`pipeweave.planner.evaluate.plan_costs`); the per-round fit of the scales and
latencies (:mod:`.calibration_rounds`) then runs on top.

Kept only where it prices the calibration's own runs better: the parameters are fitted with
and without it, and it stays if the calibration plans' summed relative errors are smaller
with it (:func:`.calibration_runs.fit_calibration`). The default plan is not one it is
fitted from, so it is the check: on gpt-small at 2 ranks (2026-11-27, quiet,
``benchmarks/auto.py``) the closed form gave 18.8 ms an action and the default, which ran
236 ms, was predicted at 368 ms.

Not fitted where the ranks outnumber the cores (``AutoProblem.shared_cores``): there every
rank of the two data-parallel plans computes at once, so what each of their actions adds is
the time-slicing of busy ranks, which a pipeline, whose ranks wait in turn, does not pay per
action; ``action_overhead`` (fitted from the same small plan) prices it instead. Measured
quietly (2026-11-27 15:19-15:39 UTC, ``benchmarks/auto_predict.py``, 18 runs at 2 and 4
ranks): the fit was 0 in 14 runs and 0.14-0.34 ms in three of cnn's; its one large value,
17 ms at 4 ranks (gpt-small), predicted the default at 899 ms where it ran 464 ms.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

__all__ = ["PER_ACTION", "action_compute", "fit_action_compute", "round_action_compute"]

PER_ACTION = "compute_per_action"
"""The fitted parameter's name: ``RuntimeCosts.compute_per_action``."""

_STEP = 1e-4
"""Seconds added per action to count a plan's compute actions from its simulation."""

Compute = Callable[[Mapping[str, float]], float]


def action_compute(compute: Compute) -> tuple[float, float]:
    """``(S, n)`` of a plan's compute probe (``parameters -> simulated compute seconds per
    iteration``): its compute without the cost and the compute actions per iteration."""
    base = compute({})
    return base, (compute({PER_ACTION: _STEP}) - base) / _STEP


def round_action_compute(large: tuple[float, float], small: tuple[float, float],
                         measured_large: float, measured_small: float) -> float:
    """One round's ``k`` (module docstring) from ``(S, n)`` of the plan at the larger and at
    the smaller micro-batches and their measured compute; 0 where the measurements leave no
    positive cost."""
    (s1, n1), (s2, n2) = large, small
    denominator = measured_large * n2 - measured_small * n1
    if denominator <= 0:
        return 0.0
    return max(0.0, (measured_small * s1 - measured_large * s2) / denominator)


def fit_action_compute(large: Compute, small: Compute, measured_large: Sequence[float],
                       measured_small: Sequence[float]) -> float:
    """The median over the rounds of :func:`round_action_compute` for the two plans' compute
    probes and their measured compute per round (summed over ranks)."""
    if len(measured_large) != len(measured_small) or not measured_large:
        raise ValueError(f"the two plans need the same number (>= 1) of rounds of measured "
                         f"compute; got {len(measured_large)} and {len(measured_small)}: time "
                         f"both in every round")
    one, two = action_compute(large), action_compute(small)
    return statistics.median(round_action_compute(one, two, a, b)
                             for a, b in zip(measured_large, measured_small))
