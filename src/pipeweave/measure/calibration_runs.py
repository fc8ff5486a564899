"""The costs a distributed run adds, fitted from real runs of plans that stress different
ones: the message latency, the all-reduce's fixed cost and, where more ranks than cores share
the machine, the overhead of each action.

Two or three plans are trained on local processes in alternating rounds
(:mod:`.alternating`; 3 by default, so that the median leaves out one disturbed round), each
about ``seconds`` of timed iterations per round:

* ``default``: 1F1B, the uniform split over the ranks, M = 2 x ranks: every micro-batch
  crosses every stage boundary, so its time moves with ``message_latency``;
* ``data-parallel``: the whole model as one stage replicated on every rank, the default's M:
  no message between stages, one all-reduce of the whole model per iteration, so its time
  moves with ``allreduce_latency`` (:mod:`pipeweave.profiler.runtime_costs`; fitted only
  where the profile knows the all-reduce's bandwidth, :mod:`.collective`);
* ``data-parallel-small``: the same data-parallel plan at the largest M the search tries
  (``8 x ranks`` by default, the smallest micro-batches): the same all-reduce, the same
  samples, 4x the actions, so its time moves with ``action_overhead`` (what an action costs
  beyond its compute, e.g. when 4 processes share 2 cores; docs/auto.md measured the
  data-parallel plan at M = 32 at 28 ms where 9 ms was predicted). Its compute scale
  against the data-parallel plan's is the compute scale by micro-batch size
  (:mod:`.calibration_sizes`: ``RuntimeCosts.size_scales``).

The ranks' compute: the seconds of F, B, I and W actions per iteration on the runs'
timelines, summed over ranks, against the same simulated; the factor (at least 1) that
equates them is a plan's compute scale in that round, which multiplies every compute action
(the send thread and gloo's threads take the cores from the compute; a run under load
computes slower than the profile did). Each other parameter is the value at which its
plan's simulated iteration, at that plan's own scale, equals the round's measurement. Each
round is solved on its own (:func:`~.calibration_solve.solve`: Gauss-Seidel bisections,
then Newton steps, exact where plans depend on several parameters; a plan measured faster
than predicted with its parameter at 0 leaves it at 0), and each parameter is the median of
its rounds, the compute scale per size the median of its plan's per-round scales
(:mod:`.calibration_rounds` says why: one scale shared by the plans let the latencies trade
against it; :mod:`.calibration_sizes` why per size). Parameters from plans measured under the same load: before, one parameter
from one run of the default plan had to absorb the all-reduce too, and the data-parallel
winner was predicted 15-31 % fast while the default was 15-31 % slow (docs/auto.md).

The default plan computes at the data-parallel plan's scale (the same micro-batch size), and
its compute fixes :data:`WAITING`: ``compute_per_receive``, what each action that takes a
message from another rank computes beyond the others, or, only where the ranks outnumber the
cores, ``wait_share``, the share of a core a waiting rank takes (:mod:`.calibration_rounds`,
``borrow``; :func:`_borrowed`).

The action overhead is taken to lie outside the timed actions (the interpreter between
them, the wake-up when a shared core comes back): the timelines' compute, and so
the compute scales, do not include it.

Each probe only re-prices a plan partitioned once, so a fit is some hundred simulations of
two or three small plans per round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..auto import AutoProblem, Candidate
from ..auto.predict import candidate_costs, candidate_plan, simulate_candidate
from ..auto.scaling import scaled_profile
from ..auto.search import default_prediction
from ..auto.timing import plan_schedule
from ..ir import COMPUTE_OPS
from ..planner.evaluate import simulated_iterations
from ..sim import simulate
from ..planner.plan import Plan
from ..profiler import Profile
from ..profiler.runtime_costs import RuntimeCosts
from .alternating import TIMED_SECONDS, Rounds, time_rounds
from .calibration_rounds import PER_RECEIVE, WAIT_SHARE, fit_rounds
from .calibration_sizes import PER_ACTION, SIZE_SCALE, size_scale_values, size_scales_of
from .calibration_solve import Target, solve

__all__ = ["CalibrationFit", "CalibrationPlan", "Target", "PARAMETERS", "calibration_plans",
           "data_parallel_candidate", "fit_calibration", "fit_measured",
           "smallest_batches", "solve", "with_costs", "with_fit", "compute_faster"]

PARAMETERS = {"default": "message_latency", "data-parallel": "allreduce_latency",
              "data-parallel-small": "action_overhead"}
"""Which runtime cost each calibration plan's time fixes."""


def with_costs(profile: Profile, values: Mapping[str, float]) -> Profile:
    """``profile`` whose runtime costs have the fitted ``values`` (field name -> seconds).
    A ``compute_scale`` below 1 (the runs computed faster than the profile: it was measured
    under a heavier load, or its co-located sharing overhead came out high) goes into the
    blocks' compute times instead (:func:`compute_faster`), the runtime's scale left at 1,
    so that the search's lower bounds from the profile's times stay bounds."""
    runtime = profile.runtime if profile.runtime is not None else RuntimeCosts()
    prefix = SIZE_SCALE.format("")
    fields: dict[str, Any] = {name: value for name, value in values.items()
                              if not name.startswith(prefix)}
    sized = size_scales_of(values)
    if sized:
        fields["size_scales"] = sized
    scale = fields.get("compute_scale", runtime.compute_scale)
    if scale < 1:
        profile, fields["compute_scale"] = compute_faster(replace(profile, runtime=runtime),
                                                          scale), 1.0
    assert profile.runtime is not None
    return replace(profile, runtime=replace(profile.runtime, **fields))


def compute_faster(profile: Profile, scale: float) -> Profile:
    """``profile`` whose compute actions take ``scale`` of their time: every block's
    forward, backward, I and W, and the runtime's fixed costs per action and per block of
    those kinds (what ``compute_scale`` multiplies, :mod:`pipeweave.planner.evaluate`; not
    the update, not the posting of a send)."""
    blocks = tuple(replace(b, forward=b.forward * scale, backward=b.backward * scale,
                           input_grad=b.input_grad * scale, weight_grad=b.weight_grad * scale)
                   for b in profile.blocks)
    runtime = profile.runtime
    if runtime is not None:
        def faster(table: Mapping[str, float]) -> dict[str, float]:
            return {kind: value * (scale if kind in _COMPUTE_KINDS else 1.0)
                    for kind, value in table.items()}

        runtime = replace(runtime, per_action=faster(runtime.per_action),
                          per_block=faster(runtime.per_block),
                          compute_per_action=runtime.compute_per_action * scale,
                          compute_per_receive=runtime.compute_per_receive * scale)
    return replace(profile, blocks=blocks, runtime=runtime)


_COMPUTE_KINDS = ("forward", "backward", "input_grad", "weight_grad")


def with_fit(problem: AutoProblem, values: Mapping[str, float]) -> AutoProblem:
    """``problem`` with the fitted ``values``: its profile's runtime costs
    (:func:`with_costs`), and a scale below 1 in the other micro-batch sizes' profiles too."""
    scale = values.get("compute_scale", 1.0)
    extra = tuple(compute_faster(p, scale) for p in problem.extra_profiles) if scale < 1 \
        else problem.extra_profiles
    return replace(problem, profile=with_costs(problem.profile, values), extra_profiles=extra)


def data_parallel_candidate(problem: AutoProblem,
                            microbatches: int | None = None) -> Candidate | None:
    """The whole model as one stage on every rank, 1F1B at ``microbatches`` (default: the
    default's M; ``None`` for one rank, or where M does not divide the batch)."""
    ranks = problem.ranks
    microbatches = problem.default_microbatches if microbatches is None else microbatches
    if ranks < 2 or problem.batch % microbatches or microbatches % ranks:
        return None
    return Candidate(schedule="1f1b", method="pipedream", depth=1, width=1, chunks=1,
                     pipelines=1, microbatches=microbatches, recompute=0, apc=False,
                     bounds=((0, problem.profile.num_blocks),), replicas=(ranks,))


Probe = Callable[[Mapping[str, float]], float]


@dataclass(frozen=True)
class CalibrationPlan:
    """A calibration plan, partitioned once, and its simulation at any parameters."""

    plan: Plan
    predicted: float
    """Seconds per iteration predicted with the fitted parameters at 0."""
    iteration: Probe
    """``parameters -> simulated seconds per iteration``."""
    compute: Probe
    """``parameters -> simulated seconds of compute actions per iteration, summed over
    ranks``."""


def smallest_batches(problem: AutoProblem) -> int | None:
    """The largest M the search tries on a data-parallel plan (``--microbatches``, else
    ``ranks x (1, 2, 4, 8)``, as :mod:`pipeweave.auto.axes`) that divides the batch and
    splits evenly over the ranks, if it exceeds the default's M; else ``None``."""
    ranks = problem.ranks
    counts = problem.microbatches or tuple(ranks * k for k in (1, 2, 4, 8))
    fitting = [m for m in counts if problem.batch % m == 0 and m % ranks == 0
               and m > problem.default_microbatches]
    return max(fitting, default=None)


def calibration_plans(problem: AutoProblem, *,
                      actions: bool = True) -> dict[str, CalibrationPlan]:
    """Per calibration plan that can be built and whose parameter the profile can price
    (module docstring); ``actions``: add ``data-parallel-small`` where a larger M than the
    default's fits (False: not at all)."""
    zero = {"compute_scale": 1.0, PER_ACTION: 0.0, WAIT_SHARE: 0.0, PER_RECEIVE: 0.0,
            **{name: 0.0 for name in PARAMETERS.values()}}
    plain = replace(problem, profile=with_costs(problem.profile, zero))
    out: dict[str, CalibrationPlan] = {}
    found = default_prediction(plain)
    if found is not None:
        out["default"] = CalibrationPlan(found.plan, found.iteration_time,
                                         *_probes(found.candidate, plain))
    runtime = problem.profile.runtime
    if runtime is None or runtime.allreduce_bandwidth is None:
        return out
    small = smallest_batches(plain) if actions else None
    for label, count in (("data-parallel", None), ("data-parallel-small", small)):
        parallel = data_parallel_candidate(plain, count)
        if parallel is None or (label == "data-parallel-small" and count is None):
            continue
        try:
            probes = _probes(parallel, plain)
            timed = simulate_candidate(parallel, _scaled(parallel, plain), plain)
        except ValueError:
            return out  # a model the whole of which one rank cannot run
        out[label] = CalibrationPlan(timed.plan, timed.iteration_time, *probes)
    return out


def _scaled(candidate: Candidate, problem: AutoProblem) -> Profile:
    return scaled_profile(problem.profile, problem.batch // candidate.microbatches,
                          problem.extra_profiles)


def _probes(candidate: Candidate, problem: AutoProblem) -> tuple[Probe, Probe]:
    scaled = _scaled(candidate, problem)
    plan = candidate_plan(candidate, problem)
    iterations = simulated_iterations(plan.schedule)
    schedule = plan_schedule(plan, iterations, one_copy=False)

    def iteration_time(values: Mapping[str, float]) -> float:
        return simulate_candidate(candidate, with_costs(scaled, values), problem).iteration_time

    def compute(values: Mapping[str, float]) -> float:
        costs = candidate_costs(candidate, plan, with_costs(scaled, values), problem)
        result = simulate(schedule, costs)
        return sum(end - start for program, starts, ends in
                   zip(result.schedule.programs, result.start, result.end)
                   for action, start, end in zip(program, starts, ends)
                   if action.op in COMPUTE_OPS) / iterations

    return iteration_time, compute


@dataclass(frozen=True)
class CalibrationFit:
    """What :func:`fit_calibration` measured and fitted (seconds)."""

    measured: Mapping[str, Rounds]
    predicted_before: Mapping[str, float]
    fitted: Mapping[str, float]
    compute: Mapping[str, Sequence[float]]
    """Per plan, per round: the measured compute seconds per iteration, summed over ranks."""
    rounds: Sequence[Mapping[str, float]] = ()
    """Each round's own fit (:func:`~.calibration_rounds.fit_rounds`); ``fitted`` is their
    median."""
    predicted_after: Mapping[str, float] = field(default_factory=dict)
    """Per plan, its seconds per iteration simulated at ``fitted``: how well one set of
    parameters prices every calibration plan (each round fits each plan at its own compute
    scale; ``fitted`` takes the median scale)."""

    def to_json(self) -> dict[str, Any]:
        return {"plans": {label: {**rounds.to_json(),
                                  "predicted_before": self.predicted_before[label],
                                  **({"predicted_after": self.predicted_after[label],
                                      "error_after": self.predicted_after[label]
                                      / rounds.median - 1.0}
                                     if label in self.predicted_after else {}),
                                  "compute_seconds": list(self.compute[label]),
                                  "parameter": PARAMETERS[label]}
                          for label, rounds in self.measured.items()},
                **dict(self.fitted), "per_round": [dict(one) for one in self.rounds]}


def fit_calibration(problem: AutoProblem, *,
                    time_one: Callable[[str, Plan, int], tuple[float, Sequence[float]]],
                    rounds: int = 3, seconds: float = TIMED_SECONDS,
                    actions: bool = True, say: Callable[[str], None] | None = None
                    ) -> tuple[AutoProblem, CalibrationFit | None]:
    """``problem`` with its profile's runtime costs fitted to alternating runs of the
    calibration plans (module docstring; ``actions`` as :func:`calibration_plans`);
    ``time_one(label, plan, steps)`` -> (measured seconds per iteration, per rank compute
    seconds per iteration) of one run. ``None``: no plan to run."""
    plans = calibration_plans(problem, actions=actions)
    if not plans:
        return problem, None
    timed = time_rounds({label: (p.plan, p.predicted) for label, p in plans.items()},
                        {label: time_one for label in plans}, rounds=rounds, seconds=seconds,
                        steps=None, say=say)
    return fit_measured(problem, plans, timed.rounds, timed.compute)


def fit_measured(problem: AutoProblem, plans: Mapping[str, CalibrationPlan],
                 measured: Mapping[str, Rounds], compute: Mapping[str, Sequence[float]]
                 ) -> tuple[AutoProblem, CalibrationFit]:
    """``problem`` (not yet fitted) with the runtime costs fitted to ``measured`` rounds of
    its calibration ``plans`` (:func:`calibration_plans`) and their
    ``compute`` per round (summed over ranks): :func:`fit_calibration` after its runs, and
    ``auto --run`` again on the plans re-timed beside the winner
    (:mod:`.calibration_retime`)."""
    names = {label: PARAMETERS[label] for label in plans}
    times = {label: rounds.times for label, rounds in measured.items()}
    borrow = _borrowed(problem)
    found = fit_rounds(plans, names, times, compute, borrow, WAITING)
    sized = size_scale_values({label: problem.batch // plans[label].plan.microbatches
                               for label in _LENDERS if label in plans}, found.rounds)
    fitted = {**found.fitted, **sized, PER_ACTION: 0.0}
    fit = CalibrationFit(measured=measured, fitted=fitted, compute=compute, rounds=found.rounds,
                         predicted_before={label: p.predicted for label, p in plans.items()},
                         predicted_after={label: p.iteration(fitted)
                                          for label, p in plans.items()})
    return with_fit(problem, fitted), fit


WAITING = PER_RECEIVE
"""What the default plan's compute fixes (:func:`_borrowed`): ``compute_per_receive`` (a
fixed cost per action that takes a message), or ``wait_share`` (a waiting rank's share of a
core, where ranks outnumber cores); ``benchmarks/wait_share_ab.py`` compares them."""


_LENDERS = ("data-parallel", "data-parallel-small")
"""The calibration plans that compute at their own scale (every rank computing, no message
between stages), one per micro-batch size: the compute scale by size
(:func:`~.calibration_sizes.size_scale_values`)."""


def _borrowed(problem: AutoProblem) -> dict[str, str]:
    """The default plan (a pipeline: its ranks take messages) computes at the data-parallel
    plan's scale (the same micro-batch size, no message), and the difference fixes
    :data:`WAITING` (:mod:`.calibration_rounds`): a cost per received message wherever
    (measured 2026-11-27 at 2 ranks on 2 cores: the default computed at 1.01-1.28x the
    profile where the data-parallel plan took 0.92-1.16x in the same rounds), a waiting
    rank's share of a core only where the ranks outnumber the cores."""
    cores = problem.shared_cores
    shared = cores is not None and cores < problem.ranks
    return {"default": "data-parallel"} if shared or WAITING == PER_RECEIVE else {}
