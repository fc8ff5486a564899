"""Algorithm 1 at run time: AvgPipe's advance chosen iteration by iteration (avgpipe.txt §4.2).

The paper's first GPU starts in 1F1B and, after each batch, runs one more forward in
advance while training gets faster and memory allows. Here the schedule stays data from the
``avgpipe`` generator and the runtime stays its interpreter; only *which* schedule runs next
is decided at run time::

    iteration:      0 (warm-up)   1          2          3          4 ...          K-1
    schedule:       avgpipe(first_iteration=k, iterations=1, advance=a_k)  | rest, one schedule
    a_k:            0             0          1          2          1 (settled) ...
                                   └ measure ┴ measure ┴ measure ┘
                                     all ranks: all_reduce(MAX) of [time, memory] -> controller

* **One iteration at a time.** Iteration ``k`` is laid out alone (``first_iteration = k``, the
  run's micro-batch numbers and versions). ``avgpipe`` flushes every iteration, so that is
  exactly iteration ``k`` of the whole run's schedule, same actions, same order
  (tests/schedules/test_avgpipe.py), and no action depends on another iteration's actions —
  only on its weight updates, which every rank has applied when its program for ``k`` ends.
  Once the controller has settled, the remaining iterations run as one schedule (no more
  synchronisation between iterations), split only where a checkpoint is due.
* **Checkpoints.** A window ends at every step a checkpoint is written after (``stops``), a
  flush of ``avgpipe`` like every other step boundary; the checkpoint is taken there, after
  the controller has seen the window's numbers, and keeps :meth:`OnlineAdvance.state` (the
  controller's state, the advances so far, the log). A resumed run restores it and starts
  its windows at the checkpoint's step, so it takes the decisions the uninterrupted run would
  have taken *given the same measurements*: bit for bit with a deterministic ``time_source``;
  with wall-clock times the decisions after the restart come from new measurements (the
  losses and parameters still equal those of a run with the same sequence of advances,
  which never changes the numbers).
* **Measure.** Each rank times its program for the iteration and counts its memory: model
  state plus the peak activation bytes held (:mod:`..observation.memory`). A rank whose iteration ended
  enters ``all_reduce(MAX)`` of ``[seconds, state + activations, activations]``; the first
  stage's rank starts first and ends last in a flushed iteration, so the maximum time is its
  iteration time, and the maximum memory is the fullest device's (the limit is per device).
  The same vector carries one slot per rank for each rank's own memory (zero elsewhere, so
  the maximum is the value): the log keeps every rank's numbers, which the tuner's real runs
  read (``pipeweave tune --source measure``), at no extra collective.
* **Decide.** Every rank feeds the same numbers to its own
  :class:`~pipeweave.avgpipe.controller.AdvanceController`, a deterministic state machine, so
  all ranks choose the same advance: the same outcome as the first stage's rank deciding and
  broadcasting, with one small collective instead of two (a reduction is needed anyway for the
  memory of the other devices). The collective also fences the iterations: no rank starts
  ``k + 1`` with an advance the others have not chosen.
* **Weights.** Each rank's weight versions are analysed once, on the whole run at advance 0.
  ``avgpipe`` is synchronous: every forward and backward of iteration ``k`` uses version ``k``,
  live, whatever the advance (:func:`check_live_weights`), so that analysis holds for every
  iteration's schedule.

The single-process executor runs the same loop over the same schedules; the numbers it
measures are those of one process running every rank in turn (the sum of all ranks' work,
which the advance hardly changes), so without a ``time_source`` it settles at 1F1B. The
memory it counts is the same as in a distributed run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...avgpipe.controller import AdvanceController
from ...ir import Schedule
from ...schedules import available_schedules, get_info
from ...schedules.avgpipe import parse_advance
from .options import AdvanceOptions
from ..execution.interpreter import RankInterpreter
from ..job import Job
from ..observation.memory import ActivationMeter, check_memory_limit, estimate_state_bytes, state_bytes
from ...planner.plan import Plan
from ..execution.parts import RankParts, make_schedule

if TYPE_CHECKING:
    from ...models import ModelSpec

__all__ = ["Window", "OnlineAdvance", "check_online_plan", "check_advance", "check_advance_resume",
           "new_controller", "check_live_weights", "run_rank_windows", "run_local_windows"]


@dataclass(frozen=True)
class Window:
    """Iterations ``first .. first + count - 1``, laid out at ``advance``; ``measured``:
    whether the ranks time it and share the numbers (one iteration, while the controller
    decides or measures a fixed advance; not the settled run's windows that end where a
    checkpoint is due)."""

    first: int
    count: int
    advance: int
    schedule: Schedule
    measured: bool


def check_online_plan(plan: Plan) -> None:
    """ValueError naming the fix unless ``plan`` can run under the online advance controller."""
    if not get_info(plan.schedule).online_advance:
        takes = [info.name for info in available_schedules() if info.online_advance]
        raise ValueError(f"the online advance controller is AvgPipe's Algorithm 1; it runs "
                         f"schedule {' or '.join(map(repr, takes))}, not {plan.schedule!r}. Use "
                         f"--schedule {takes[0] if takes else 'avgpipe'} or a fixed schedule "
                         f"without --advance auto")
    if "advance" in plan.schedule_options or "first_iteration" in plan.schedule_options:
        fixed = {k: plan.schedule_options[k] for k in ("advance", "first_iteration")
                 if k in plan.schedule_options}
        raise ValueError(f"the plan fixes {fixed}, but with --advance auto the controller "
                         f"chooses the advance, starting at 0 (1F1B); drop the option or "
                         f"give --advance K instead of auto")


class OnlineAdvance:
    """Which iterations run next at which advance; fed the shared measurements.

    Iterate :meth:`windows`; after running a :attr:`Window.measured` window, call
    :meth:`observe` with the numbers every rank agreed on, before asking for the next.
    """

    def __init__(self, plan: Plan, steps: int, options: AdvanceOptions, *,
                 stops: Collection[int] = ()) -> None:
        """``stops``: steps (1-based) after which a window ends even once settled (where
        checkpoints are written: :meth:`state` is saved there)."""
        check_online_plan(plan)
        self.plan = plan
        self.steps = steps
        self.options = options
        self.stops = frozenset(stops)
        self.start = 0
        """The first step this run performs (:meth:`restore` moves it to the checkpoint's)."""
        self.controller = new_controller(plan, options)
        self.fixed = (None if options.fixed is None
                      else parse_advance(options.fixed, plan.microbatches))
        self.advance_per_step: list[int] = []
        self.log: list[dict[str, Any]] = []
        """One entry per measured iteration: the numbers shared and the controller's answer."""

    def windows(self) -> Iterator[Window]:
        step = self.start
        while step < self.steps:
            single = self.fixed is not None or not self.controller.settled
            count = 1 if single else min([s for s in self.stops if s > step] + [self.steps]) - step
            advance = self.controller.advance if self.fixed is None else self.fixed
            self.advance_per_step.extend([advance] * count)
            yield Window(step, count, advance, self.schedule(step, count, advance),
                         measured=single or count == self.steps - step == 1)
            step += count

    def state(self) -> dict[str, Any]:
        """What a checkpoint after the last window keeps (plain JSON data): the controller's
        state, the advance of every step so far and the log."""
        return {"steps_done": len(self.advance_per_step),
                "controller": self.controller.state_dict(),
                "advance_per_step": list(self.advance_per_step), "log": list(self.log)}

    def restore(self, state: dict[str, Any], steps_done: int) -> None:
        """Continue after ``steps_done`` steps from :meth:`state` saved there: the windows
        start at ``steps_done`` with the controller where it was, so the run takes the
        decisions the uninterrupted one would (given the same measurements)."""
        if state["steps_done"] != steps_done:
            raise ValueError(f"the advance controller's state is of step {state['steps_done']}, "
                             f"the checkpoint of step {steps_done}: a damaged checkpoint; "
                             f"resume an earlier one")
        self.controller.load_state_dict(state["controller"])
        self.advance_per_step = [int(a) for a in state["advance_per_step"]]
        self.log = [dict(entry) for entry in state["log"]]
        self.start = steps_done

    def schedule(self, first: int, count: int, advance: int) -> Schedule:
        """The lowered ``avgpipe`` schedule of iterations ``first .. first + count - 1``."""
        options = {**self.plan.schedule_options, "advance": advance, "first_iteration": first}
        return make_schedule(replace(self.plan, schedule_options=options), count)

    def observe(self, window: Window, seconds: float, peak_bytes: float,
                activation_bytes: float, *, peak_per_rank: Sequence[float] | None = None,
                activation_per_rank: Sequence[float] | None = None) -> None:
        """Record a measured window; feed it to the controller unless it is a warm-up.

        ``peak_per_rank`` / ``activation_per_rank``: every rank's own numbers (the fullest
        device's are ``peak_bytes`` / ``activation_bytes``), logged for the tuner.
        """
        fed = (self.options.time_source(window.advance, seconds)
               if self.options.time_source is not None else seconds)
        entry: dict[str, Any] = {"step": window.first + 1, "advance": window.advance,
                                 "measured_s": seconds, "iteration_s": fed,
                                 "peak_bytes": peak_bytes, "activation_bytes": activation_bytes}
        if peak_per_rank is not None and activation_per_rank is not None:
            entry.update(peak_bytes_per_rank=[float(v) for v in peak_per_rank],
                         activation_bytes_per_rank=[float(v) for v in activation_per_rank])
        if self.fixed is not None:
            entry.update(decision="fixed", next_advance=self.fixed, reason="")
        elif window.first < self.options.warmup:
            entry.update(decision="warmup", next_advance=self.controller.advance, reason="")
        else:
            self.controller.next_advance(fed, peak_bytes)
            last = self.controller.history[-1]
            entry.update(decision=last.decision, next_advance=last.next_advance,
                         reason=last.reason)
            if window.advance == 0 and peak_bytes > self.controller.limit_bytes:
                warnings.warn(f"the memory limit {self.controller.limit_bytes:.0f} B is exceeded "
                              f"even at advance 0 (1F1B): {peak_bytes:.0f} B; the run stays at "
                              f"1F1B. Raise --memory-limit, or use more micro-batches or fewer "
                              f"pipelines", RuntimeWarning, stacklevel=2)
        self.log.append(entry)


def new_controller(plan: Plan, options: AdvanceOptions) -> AdvanceController:
    """The controller of a run of ``plan`` with ``options``, at its start (advance 0)."""
    limit = options.memory_limit if options.memory_limit is not None else math.inf
    return AdvanceController(limit, max(plan.microbatches - 1, 0), patience=options.patience,
                             tolerance=options.tolerance, samples=options.samples)


def check_advance_resume(job: Job, manifest: Mapping[str, Any]) -> None:
    """Before any rank starts: the checkpoint ``manifest`` that ``job`` resumes holds the
    online advance controller's state, saved with the same settings, when ``job.advance`` asks
    for the controller (a run with a fixed advance resumes any ``avgpipe`` checkpoint)."""
    if job.advance is None:
        return
    state = manifest.get("advance")
    if state is None:
        raise ValueError(f"the checkpoint after step {manifest['step']} was written without the "
                         f"online advance controller (a fixed advance), so there is no "
                         f"controller state to continue with --advance auto; resume it with "
                         f"--advance K, or start a new run")
    new_controller(job.plan, job.advance).load_state_dict(state["controller"])


def check_advance(job: Job, spec: ModelSpec) -> None:
    """Before any rank starts: ``job.advance`` fits the plan, and its memory limit leaves room
    for more than the model state (:func:`~pipeweave.runtime.observation.memory.check_memory_limit`)."""
    if job.advance is None:
        return
    check_online_plan(job.plan)
    if job.advance.memory_limit is not None:
        check_memory_limit(job.advance.memory_limit,
                           estimate_state_bytes(spec, job.plan, job.optimizer), job.plan)


def check_live_weights(parts: Sequence[RankParts]) -> None:
    """Every forward uses the live weights (see the module docstring), or stop."""
    for rank_parts in parts:
        for pipeline in rank_parts.pipelines:
            for stage, weights in pipeline.weights.items():
                modes = {plan.mode for plan in weights.plans.values()}
                if modes - {"live"}:
                    raise RuntimeError(f"stage {stage}: weight modes {sorted(modes)}; the online "
                                       f"advance controller needs a synchronous schedule")


def run_rank_windows(online: OnlineAdvance, parts: RankParts,
                     interpreter: Callable[[Schedule, ActivationMeter], RankInterpreter],
                     *, device: torch.device,
                     before: Callable[[Schedule], None] | None = None,
                     after: Callable[[int], None] | None = None) -> None:
    """One rank of a distributed run: every window through ``interpreter(schedule, meter)``.

    ``before(schedule)`` runs before each window (e.g. the transport's delivery tracking);
    ``after(steps_done)`` after each, once the controller has its numbers (checkpoints).
    """
    check_live_weights([parts])
    meter = ActivationMeter()
    for window in online.windows():
        if before is not None:
            before(window.schedule)
        meter.start_window()
        began = time.perf_counter()
        for _ in interpreter(window.schedule, meter).run():
            raise AssertionError("the distributed transport never yields")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if window.measured:
            seconds = time.perf_counter() - began
            peak, held = float(state_bytes(parts) + meter.window_peak), float(meter.window_peak)
            # [time, peak, activations | peak of rank 0..R-1 | activations of rank 0..R-1]:
            # each rank fills its own slots, so one MAX gives everyone every rank's numbers
            rank, ranks = dist.get_rank(), dist.get_world_size()
            own = [seconds, peak, held] + [0.0] * (2 * ranks)
            own[3 + rank], own[3 + ranks + rank] = peak, held
            shared = torch.tensor(own, dtype=torch.float64, device=device)
            dist.all_reduce(shared, op=dist.ReduceOp.MAX)
            values = [float(v) for v in shared.tolist()]
            online.observe(window, *values[:3], peak_per_rank=values[3:3 + ranks],
                           activation_per_rank=values[3 + ranks:])
        if after is not None:
            after(window.first + window.count)


def run_local_windows(online: OnlineAdvance, parts: Sequence[RankParts],
                      run: Callable[[Schedule, Sequence[ActivationMeter]], None],
                      after: Callable[[int], None] | None = None) -> None:
    """The single-process executor: ``run(schedule, meters)`` runs every rank's program;
    ``after(steps_done)`` after each window, once the controller has its numbers."""
    check_live_weights(parts)
    meters = [ActivationMeter() for _ in parts]
    for window in online.windows():
        for meter in meters:
            meter.start_window()
        began = time.perf_counter()
        run(window.schedule, meters)
        if window.measured:
            seconds = time.perf_counter() - began
            peaks = [float(state_bytes(p) + m.window_peak) for p, m in zip(parts, meters)]
            held = [float(m.window_peak) for m in meters]
            online.observe(window, seconds, max(peaks), max(held), peak_per_rank=peaks,
                           activation_per_rank=held)
        if after is not None:
            after(window.first + window.count)
