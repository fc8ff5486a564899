"""The calibration's parameters fitted round by round, each plan at the compute speed its own
timeline measured, and the median over the rounds (:mod:`.calibration_runs` calls it).

Why not one fit to the plans' medians with one shared ``compute_scale`` (before
2026-11-27): a plan's run moves as a whole with the machine's load and with how the
scheduler happens to place its processes, and its timeline's compute moves with it (gpt-tiny
on 4 ranks, the default plan: rounds of 72, 63 and 71 ms whose compute summed over ranks was
112, 96 and 108 ms, the same 1.5 ratio each round). One scale fitted to the compute of all
plans together is then too small for the slower plan and too large for the faster one, and
the message latency and the all-reduce's fixed cost, each a small difference between a
measured and a simulated iteration, absorb what the scale got wrong: the same case fitted a
message latency of 1.2-2.6 ms and an all-reduce cost of 0.9-13 ms from run to run, and a
shared scale that one loaded plan pulled up left the default's message latency at 0 (cnn on
2 ranks under load: winners with many messages predicted 52-57 % fast). Here the scale is
not a fitted unknown the latencies trade against: each plan in each round gets the scale its
own measured compute says (``compute_scale@label``, solved with the others: where ranks
share cores the simulated compute stretches with the overlap, which the latencies move), so
each latency answers only for the time its plan spent outside compute. A scale may be below 1
(down to :data:`SCALE_FLOOR`): where the runs compute faster than the profile (measured
under a heavier load, or a co-located sharing overhead measured high), a scale held at 1
left the difference to the latencies, which it pushed to 0 (gpt-tiny on 2 ranks, profiled at
load 4: the default's compute simulated at 130 ms a round, measured 45-54). A final scale
below 1 goes into the blocks' times (:func:`~.calibration_runs.with_costs`).

Where more ranks than cores share the machine, the plans' own scales differ by shape, not
only by load: the default plan (a pipeline, most ranks waiting) computed at 1.23 / 1.29 /
0.87 (gpt-tiny, 4 ranks on 2 cores) and 1.71 / 0.98 / 1.98 (cnn) of its simulated compute
where the data-parallel plan (every rank computing) in the same rounds took 1.04 / 0.83 /
0.71 and 0.80 / 0.48 / 0.86 (``benchmarks/results/auto_predict.json``): a waiting rank
takes cores too (gloo's socket thread, the send thread, the wake-up;
``benchmarks/waiting_cpu.py``), which the processor-sharing walk did not count, and the
median scale priced every pipeline fast. There ``borrow`` (``{"default":
"data-parallel"}``, :mod:`.calibration_runs`) runs the default plan at the data-parallel
plan's scale of the same round, and the default's measured compute fixes ``fixes`` instead
of a scale of its own, at least 0, the median of its rounds: :data:`PER_RECEIVE` (by
default), seconds each action that takes a message from another rank computes beyond the
others (``RuntimeCosts.compute_per_receive``), or :data:`WAIT_SHARE`, the share of a core
a waiting rank takes in the simulator's shared-cores walk (``RuntimeCosts.wait_share``,
:mod:`pipeweave.sim.shared_cores`); ``compute_scale`` is then the median of the lending
plans' scales.

With a core per rank the same holds, less: at 2 ranks on 2 cores the default computed at
1.01-1.28x the profile where the data-parallel plan took 0.92-1.16x in the same rounds
(2026-11-27, quiet), so the calibration borrows there too (``compute_per_receive``;
:func:`pipeweave.measure.calibration_runs._borrowed`), and the lending plans' scales, one
per micro-batch size, become the scale by size (:mod:`.calibration_sizes`).

Per round, every plan's iteration and compute are targets of one :func:`~.calibration_solve.solve`;
each parameter is then the median of its per-round values, and ``compute_scale`` (what
predictions of other plans use) the median of every plan's per-round scale. A median, not a
mean: one disturbed round (a neighbour's job starting; the 94 ms round among 50-55 ms ones of
gpt-tiny's data-parallel plan) moves the fit by the gap between two of the others, not by a
third of its own excess (tests/auto/test_calibration_rounds.py fails for a mean).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .calibration_solve import Target, solve

__all__ = ["PASSES", "PER_RECEIVE", "SCALE_FLOOR", "WAIT_SHARE", "Probed", "RoundFit",
           "fit_rounds", "round_targets", "scale_name"]

PER_RECEIVE = "compute_per_receive"
"""Seconds each action that takes a message from another rank computes beyond the others
(``RuntimeCosts.compute_per_receive``): what a plan that borrows another's scale fixes, by
default."""

WAIT_SHARE = "wait_share"
"""The share of a core a waiting rank takes (``RuntimeCosts.wait_share``): what a plan that
borrows another's scale may fix instead (``fit_rounds(..., fixes=WAIT_SHARE)``)."""

SCALE_FLOOR = 0.25
"""The least compute scale a plan may get: a run computing 4x faster than its profile says
the profile is wrong, not the run."""

Probe = Callable[[Mapping[str, float]], float]

PASSES = 4
"""Gauss-Seidel passes per round before Newton's steps finish it: a round has twice the
unknowns of the old single fit (a scale per plan), and 12 passes took 10-12 s of a loaded
machine for three rounds of three plans where 4 give the same fit to 0.3 % in 4-6 s."""


class Probed(Protocol):
    """A calibration plan's simulation at any parameters (``CalibrationPlan``)."""

    @property
    def iteration(self) -> Probe: ...

    @property
    def compute(self) -> Probe: ...


def scale_name(label: str) -> str:
    """The name of plan ``label``'s own compute scale among a round's unknowns."""
    return f"compute_scale@{label}"


def _at(values: Mapping[str, float], label: str) -> dict[str, float]:
    """``values`` as the runtime costs of plan ``label``: its own scale as ``compute_scale``,
    no other plan's."""
    out = {name: value for name, value in values.items() if "@" not in name}
    out["compute_scale"] = values.get(scale_name(label), 1.0)
    return out


def round_targets(plans: Mapping[str, Probed], parameters: Mapping[str, str],
                  times: Mapping[str, float], compute: Mapping[str, float],
                  borrow: Mapping[str, str] | None = None,
                  fixes: str = PER_RECEIVE) -> list[Target]:
    """One round's targets: per plan, its own compute scale (its timeline's compute seconds
    ``compute[label]`` against the simulated, without the action overhead, which lies
    outside the timed actions; at least :data:`SCALE_FLOOR`) and its parameter
    ``parameters[label]`` (its iteration ``times[label]``). A plan in ``borrow`` runs at
    the scale of the plan it names, and its compute fixes ``fixes`` (:data:`PER_RECEIVE` or
    :data:`WAIT_SHARE`) instead of a scale of its own (module docstring)."""
    borrow = dict(borrow or {})
    targets = []
    for label, plan in plans.items():
        speed = borrow.get(label, label)

        def computed(values: Mapping[str, float], speed: str = speed,
                     plan: Probed = plan) -> float:
            return plan.compute({**_at(values, speed), "action_overhead": 0.0})

        def iteration(values: Mapping[str, float], speed: str = speed,
                      plan: Probed = plan) -> float:
            return plan.iteration(_at(values, speed))

        targets.append(Target(fixes, computed, compute[label]) if label in borrow
                       else Target(scale_name(label), computed, compute[label],
                                   least=SCALE_FLOOR))
        targets.append(Target(parameters[label], iteration, times[label]))
    return targets


@dataclass(frozen=True)
class RoundFit:
    """What :func:`fit_rounds` found."""

    fitted: dict[str, float]
    """Each parameter's median over the rounds, and ``compute_scale``."""
    rounds: tuple[dict[str, float], ...]
    """Each round's own solution (the plans' own scales as ``compute_scale@label``)."""


def fit_rounds(plans: Mapping[str, Probed], parameters: Mapping[str, str],
               times: Mapping[str, Sequence[float]],
               compute: Mapping[str, Sequence[float]],
               borrow: Mapping[str, str] | None = None,
               fixes: str = PER_RECEIVE) -> RoundFit:
    """Per round (``times[label][r]``, ``compute[label][r]``), :func:`round_targets` solved
    (``borrow``, ``fixes`` as there); each parameter the median over the rounds,
    ``compute_scale`` the median of every plan's per-round scale, ``fixes`` the median of
    its rounds where ``borrow`` fits it (module docstring)."""
    if fixes not in (PER_RECEIVE, WAIT_SHARE):
        raise ValueError(f"fixes={fixes!r}: a borrowing plan's compute fixes {PER_RECEIVE!r} "
                         f"or {WAIT_SHARE!r}; give one of them")
    asked = dict(borrow or {})  # a plan borrows from a plan that runs and lends its own
    borrow = {label: other for label, other in asked.items()
              if label in plans and other in plans and other not in asked}
    counts = {len(times[label]) for label in plans} | {len(compute[label]) for label in plans}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"every plan needs the same number (>= 1) of rounds of times and of "
                         f"compute; got {sorted(counts)}: time each plan in every round")
    rounds = [solve(round_targets(plans, parameters,
                                  {label: times[label][r] for label in plans},
                                  {label: compute[label][r] for label in plans}, borrow,
                                  fixes),
                    passes=PASSES)
              for r in range(counts.pop())]
    fitted = {name: statistics.median(one[name] for one in rounds)
              for name in dict.fromkeys(parameters[label] for label in plans)}
    fitted["compute_scale"] = statistics.median(one[scale_name(label)] for one in rounds
                                                for label in plans if label not in borrow)
    if borrow:
        fitted[fixes] = statistics.median(one[fixes] for one in rounds)
    return RoundFit(fitted, tuple(rounds))
