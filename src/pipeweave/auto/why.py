"""Why the winner beats the default (``pipeweave auto --why``): each plan's simulated
iteration split into where its time goes, and the simulated timeline to look at.

One iteration of a plan, on its busiest rank (the one with the most compute and updates)::

    iteration = compute + updates + bubble + communication

* ``compute``: the F, B, I and W time of the busiest rank per iteration (recomputation
  included: a recomputing stage's backward re-runs its forward);
* ``updates``: its optimizer steps, all-reduces and averaging per iteration;
* ``communication``: what transfers add — the iteration time minus the same plan simulated
  with every transfer free (a counterfactual, so overlap that hides a transfer counts zero);
* ``bubble``: the rest: the busiest rank waiting on its neighbours with transfers free (fill
  and drain, imbalance between stages).

Each plan is simulated from the profile scaled to its own micro-batch
(:func:`~pipeweave.auto.scaling.scaled_profile`), the costs its prediction used, so the
breakdown's iteration is the table's. Every term is per iteration of one pipeline, in
seconds; the memory column is the memory
model's peak against ``--memory-limit``. Torch-free, like the rest of :mod:`pipeweave.auto`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..ir import COMPUTE_OPS, Op
from ..planner.evaluate import simulated_iterations
from ..sim import SimulationResult, simulate
from .predict import Prediction, candidate_costs, one_copy_suffices
from .repredict import priced_as_searched
from .problem import AutoProblem
from .timing import plan_schedule

__all__ = ["Breakdown", "breakdown", "differences", "format_breakdowns", "split_iteration",
           "timeline_records", "write_timeline"]

_UPDATES = frozenset({Op.STEP, Op.ALL_REDUCE, Op.AVERAGE})
TERMS = ("compute", "updates", "bubble", "communication")


@dataclass(frozen=True)
class Breakdown:
    """One plan's iteration, split (module docstring); seconds per iteration."""

    label: str
    schedule: str
    iteration_time: float
    compute: float
    updates: float
    bubble: float
    communication: float
    peak_memory_bytes: float
    memory_limit: float | None


def _busiest(result: SimulationResult) -> tuple[float, float]:
    """``(compute, updates)`` per iteration of the rank with the most of both."""
    low, high = result.window
    span = high - low
    if span <= 0:
        return 0.0, 0.0
    best = (0.0, 0.0)
    for program, starts, ends in zip(result.schedule.programs, result.start, result.end):
        compute = updates = 0.0
        for action, start, end in zip(program, starts, ends):
            inside = max(0.0, min(end, high) - max(start, low))
            if action.op in COMPUTE_OPS:
                compute += inside
            elif action.op in _UPDATES:
                updates += inside
        if compute + updates > sum(best):
            best = (compute, updates)
    scale = result.iteration_time / span
    return best[0] * scale, best[1] * scale


def _simulated(prediction: Prediction, problem: AutoProblem, *,
               free_transfers: bool) -> SimulationResult:
    plan = prediction.plan
    problem, profile = priced_as_searched(prediction, problem)
    costs = candidate_costs(prediction.candidate, plan, profile, problem)
    if free_transfers:
        costs = dataclasses.replace(costs, comm=0.0, boundary_bytes=None, bandwidth=None,
                                    latency=0.0)
    schedule = plan_schedule(plan, simulated_iterations(plan.schedule),
                             one_copy=one_copy_suffices(plan, problem))
    return simulate(schedule, costs)


def breakdown(prediction: Prediction, problem: AutoProblem, *,
              label: str) -> tuple[Breakdown, SimulationResult]:
    """``prediction``'s iteration split, and its full simulation (for the timeline)."""
    result = _simulated(prediction, problem, free_transfers=False)
    terms = split_iteration(result, _simulated(prediction, problem, free_transfers=True))
    return Breakdown(label, prediction.plan.schedule, result.iteration_time, *terms,
                     prediction.max_memory, problem.memory_limit), result


def split_iteration(result: SimulationResult,
                    free: SimulationResult) -> tuple[float, float, float, float]:
    """``(compute, updates, bubble, communication)`` per iteration of ``result``; ``free``:
    the same schedule simulated with every transfer free (module docstring)."""
    compute, updates = _busiest(result)
    communication = max(0.0, result.iteration_time - free.iteration_time)
    bubble = max(0.0, result.iteration_time - communication - compute - updates)
    return compute, updates, bubble, communication


def differences(winner: Breakdown, default: Breakdown) -> list[str]:
    """Where the two iterations differ, largest first, in words."""
    lines = []
    gained = default.iteration_time - winner.iteration_time
    for term in sorted(TERMS, key=lambda t: -abs(getattr(default, t) - getattr(winner, t))):
        delta = getattr(default, term) - getattr(winner, term)
        if abs(delta) < 1e-12:
            continue
        share = f" ({100 * delta / gained:.0f} % of the gain)" if gained > 0 else ""
        verb = "saves" if delta > 0 else "costs"
        lines.append(f"{term}: the winner {verb} {1e3 * abs(delta):.3f} ms per iteration{share}")
    limit = winner.memory_limit
    if limit is not None:
        for plan in (winner, default):
            state = "over" if plan.peak_memory_bytes > limit else "within"
            lines.append(f"memory: the {plan.label} peaks at {plan.peak_memory_bytes / 2**20:.1f} "
                         f"MiB, {state} the limit of {limit / 2**20:.1f} MiB")
    return lines


def format_breakdowns(rows: list[Breakdown]) -> str:
    """The breakdowns as a table (milliseconds per iteration)."""
    header = f"{'plan':<8} {'schedule':<16} {'iteration':>10}" + "".join(
        f" {term:>13}" for term in TERMS) + f" {'peak MiB':>9}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row.label:<8} {row.schedule:<16} {1e3 * row.iteration_time:>10.3f}"
                     + "".join(f" {1e3 * getattr(row, term):>13.3f}" for term in TERMS)
                     + f" {row.peak_memory_bytes / 2**20:>9.1f}")
    return "\n".join(lines)


def timeline_records(result: SimulationResult) -> list[tuple[int, str, float, float]]:
    """``(rank, action, start, end)`` of every timed action (what a timeline plot draws)."""
    return [(rank, str(action), start, end)
            for rank, (program, starts, ends) in enumerate(zip(result.schedule.programs,
                                                               result.start, result.end))
            for action, start, end in zip(program, starts, ends) if end > start]


def write_timeline(result: SimulationResult, path: Path, *, title: str) -> Path:
    """The simulated timeline as a PNG (matplotlib, imported here only)."""
    from ..report.timeline_plot import plot_timeline

    return plot_timeline(timeline_records(result), path, title=title, time_label="seconds")
