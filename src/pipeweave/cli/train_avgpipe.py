"""``pipeweave train``'s AvgPipe flags and its checks on ranks, run before any process starts.

    pipeweave train --schedule avgpipe --pipelines 2 [--alpha 0.5] [--advance auto|K|all]
                    [--memory-limit 2GB] [--ranks 2]

* ``--pipelines N``: AvgPipe's parallel pipelines (avgpipe.txt §3.2). They are co-partitioned:
  all N share the plan's P ranks, each rank running its stage of every pipeline, interleaved
  step by step (schedules/avgpipe.py). So N·P is how many stage *copies* exist, not how many
  ranks are needed: a run needs ``P × width`` ranks whatever N is, and N multiplies the model
  state every rank holds (which ``--memory-limit`` checks).
* ``--alpha A``: how far each parallel model is pulled toward the reference model per
  iteration, in [0, 1] (default 1/N).
* ``--average-order simultaneous|update-then-dilute``: whether a parallel model is diluted
  with its weights before (default) or after its local update; the reference model always
  takes the normalised accumulated update (runtime/execution/elastic_averaging.py).
* ``--advance``: forwards in advance beyond 1F1B's warm-up, fixed (``0`` = 1F1B, ``all`` =
  AFAB) or ``auto``: Algorithm 1 at run time, from 1F1B up while iterations get faster and
  the peak stays under ``--memory-limit`` (runtime/advance/online.py).
* ``--memory-limit BYTES``: per device. Rejected up front when the model state alone (N ×
  parameters, gradients and optimizer state, plus the reference model) reaches it.
* ``--ranks R``: the ranks given to the run. The plan fixes the rank count, so this is a
  check, and it is what the run is checked against: ``--ranks``, else torchrun's
  ``WORLD_SIZE``. With ``--device cuda`` and fewer GPUs than a machine's ranks, the ranks
  share the GPUs (a warning; :mod:`pipeweave.devices`); no GPU at all is an error. More ranks
  than CPU cores is legal but slow (a warning).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any, NamedTuple

from .. import devices
from ..models import ModelSpec
from ..runtime import Job, OptimizerFactory, Plan
from ..runtime.advance.options import AdvanceOptions
from ..runtime.observation.memory import check_memory_limit, estimate_state_bytes
from ..planner.semantics_options import AVERAGE_ORDERS
from ..runtime.observation.summary import TrainSummary
from ..schedules import available_schedules, get_info
from ..schedules.avgpipe import parse_advance

__all__ = ["add_arguments", "apply", "check_ranks", "warn_shared_devices", "parse_advance_flag",
           "fixed_advance", "add_metrics", "summary_lines"]

AVGPIPE_FLAGS = ("pipelines", "alpha", "average_order", "advance", "memory_limit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("AvgPipe (--schedule avgpipe)")
    group.add_argument("--pipelines", type=int, default=None, metavar="N",
                       help="parallel pipelines sharing the ranks, trained with elastic "
                            "averaging (default 1)")
    group.add_argument("--alpha", type=float, default=None, metavar="A",
                       help="pull toward the reference model per iteration, in [0, 1] "
                            "(default 1/N)")
    group.add_argument("--average-order", default=None, choices=list(AVERAGE_ORDERS),
                       help="dilute each parallel model before its local update (simultaneous, "
                            "the default) or after it (update-then-dilute)")
    group.add_argument("--advance", default=None, metavar="auto|K|all",
                       help="forwards in advance beyond 1F1B's warm-up: K (0 = 1F1B), all "
                            "(AFAB), or auto: chosen at run time (Algorithm 1), from 1F1B up")
    group.add_argument("--memory-limit", default=None, metavar="BYTES",
                       help="memory per device, e.g. 2GB; --advance auto stays under it")
    parser.add_argument("--ranks", type=int, default=None, metavar="R",
                        help="ranks the run is given; must be what the plan needs (stages x "
                             "width; AvgPipe's pipelines share them)")


def parse_advance_flag(text: str, microbatches: int) -> int | None:
    """``--advance`` as a fixed count, or None for ``auto``."""
    if text == "auto":
        return None
    value: object = text if text == "all" else _int_or_text(text)
    try:
        return parse_advance(value, microbatches)
    except ValueError:
        raise ValueError(f"--advance {text!r} must be 'auto', 'all' or an integer >= 0 (0 = "
                         f"1F1B, {microbatches - 1} = AFAB for --microbatches {microbatches})"
                         ) from None


def _int_or_text(text: str) -> object:
    try:
        return int(text)
    except ValueError:
        return text


def apply(args: argparse.Namespace, plan: Plan, spec: ModelSpec, optimizer: OptimizerFactory,
          limit: float | None) -> tuple[Plan, AdvanceOptions | None]:
    """The plan with the AvgPipe flags applied and the online controller's options
    (``--advance auto``); ``limit``: ``--memory-limit`` in bytes. ValueError naming the flag
    and the fix on misuse."""
    given = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in AVGPIPE_FLAGS
             if getattr(args, name) is not None]
    if not get_info(plan.schedule).pipelines:
        if given:
            takes = [info.name for info in available_schedules() if info.pipelines]
            raise ValueError(
                f"{', '.join(given)}: AvgPipe flag{'s' if len(given) > 1 else ''} (N parallel "
                f"pipelines with elastic averaging, advance forward propagation), but the "
                f"schedule is {plan.schedule!r}; add --schedule {' or '.join(takes)}, or drop "
                f"{'them' if len(given) > 1 else 'it'}")
        return plan, None
    if args.pipelines is not None:
        if args.pipelines < 1:
            raise ValueError(f"--pipelines {args.pipelines} must be >= 1 (1: a single pipeline, "
                             f"no averaging partner); e.g. --pipelines 2")
        plan = replace(plan, pipelines=args.pipelines)
    if args.alpha is not None:
        if not 0.0 <= args.alpha <= 1.0:  # NaN fails too
            raise ValueError(
                f"--alpha {args.alpha} is outside [0, 1]: it is how far each parallel model is "
                f"pulled toward the reference model per iteration (0: not at all, 1: replaced by "
                f"it); give a value in [0, 1], or leave it out for the paper's 1/N = "
                f"{1 / plan.pipelines:.3g}")
        if plan.pipelines == 1:
            print("pipeweave: warning: --alpha has no effect with one pipeline (the reference "
                  "model is that pipeline's model); add --pipelines N", file=sys.stderr)
        plan = replace(plan, semantics=replace(plan.semantics, alpha=args.alpha))
    if args.average_order is not None:
        plan = replace(plan, semantics=replace(plan.semantics, average_order=args.average_order))
    online = None
    if args.advance is not None:
        fixed = parse_advance_flag(str(args.advance), plan.microbatches)
        if "advance" in plan.schedule_options:
            raise ValueError(f"--advance {args.advance} and --option advance="
                             f"{plan.schedule_options['advance']} both set the advance; give one")
        if fixed is None:  # the plan is checked for it with the rest of the job (prepare)
            online = AdvanceOptions(memory_limit=limit)
        else:
            plan = replace(plan, schedule_options={**plan.schedule_options, "advance": fixed})
    if limit is not None:
        check_memory_limit(limit, estimate_state_bytes(spec, plan, optimizer), plan)
    return plan, online


def check_ranks(args: argparse.Namespace, plan: Plan, *, under_torchrun: bool) -> None:
    """The ranks given (``--ranks``, else torchrun's ``WORLD_SIZE``) against what ``plan``
    needs, and the device; ValueError naming the fix (warnings: :func:`warn_shared_devices`)."""
    needed = plan.processes  # tp processes per pipeline rank
    how = (f"--stages {plan.depth}" + (f" x --width {plan.width}" if plan.width > 1 else "")
           if plan.replicas is None else f"replicas {list(plan.replicas)}") + (
               f" x tp {plan.tp}" if plan.tp > 1 else "")
    given, source = args.ranks, "--ranks"
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if given is not None and given != world:
            raise ValueError(f"--ranks {given} but torchrun started {world} processes "
                             f"(WORLD_SIZE); give --ranks {world} or leave it out")
        given, source = world, "torchrun's WORLD_SIZE"
    if given is not None and given != needed:
        hint = ""
        n = plan.pipelines
        if get_info(plan.schedule).pipelines and n > 1 and given == n * needed:
            hint = (f" AvgPipe's N={n} parallel pipelines share the same ranks (co-partitioned, "
                    f"avgpipe.txt §3.2: each rank runs its stage of every pipeline), so they need "
                    f"{needed} ranks, not N x P = {given}.")
        fix = (f"start {needed} processes (torchrun --nproc-per-node {needed})" if under_torchrun
               else f"give --ranks {needed} or leave it out")
        raise ValueError(f"{source} is {given} but the plan needs {needed} rank"
                         f"{'s' if needed > 1 else ''} ({how}).{hint} Either {fix}, or change "
                         f"--stages/--width so that the plan needs {given}")
    devices.require_device(args.device)  # both executors: no GPU is one line naming the fix


def warn_shared_devices(args: argparse.Namespace, plan: Plan, *, under_torchrun: bool) -> None:
    """Once every check has passed: ranks that share a GPU or CPU cores (a warning each)."""
    needed = plan.processes
    if args.device == "cuda" and (under_torchrun or args.executor == "processes"):
        local = int(os.environ.get("LOCAL_WORLD_SIZE", needed)) if under_torchrun else needed
        shared = devices.sharing_warning("cuda", local_ranks=local, gpus=devices.gpu_count())
        if shared is not None and os.environ.get("LOCAL_RANK", "0") == "0":  # once a machine
            print(f"pipeweave: warning: {shared}", file=sys.stderr)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (args.device == "cpu" and args.executor == "processes" and not under_torchrun
            and cores is not None and needed > cores):
        print(f"pipeweave: warning: {needed} ranks on {cores} CPU cores: the ranks share cores "
              f"and run slower (the numbers they compute are unaffected)", file=sys.stderr)


def fixed_advance(job: Job) -> int | None:
    """The advance of a run of a schedule with the ``advance`` option (``avgpipe``) with a
    fixed one (None: other schedules, or auto)."""
    if "advance" not in get_info(job.plan.schedule).options or job.advance is not None:
        return None
    return parse_advance(job.plan.schedule_options.get("advance"), job.plan.microbatches)


def add_metrics(rows: list[dict[str, Any]], summary: TrainSummary) -> None:
    """Per step: the advance it ran with; for steps the online controller measured, the
    iteration time and peak memory it was told and its decision."""
    measured = {entry["step"]: entry for entry in summary.advance_log}
    for row in rows:
        step = row["step"]
        if len(summary.advance_per_step) >= step:
            row["advance"] = summary.advance_per_step[step - 1]
        if step in measured:
            entry = measured[step]
            row.update(iteration_s=entry["iteration_s"], peak_bytes=entry["peak_bytes"],
                       activation_bytes=entry["activation_bytes"], decision=entry["decision"])


class _AdvanceRun(NamedTuple):
    """Consecutive steps at one advance."""

    advance: int
    first: int
    last: int


def summary_lines(summary: TrainSummary) -> list[str]:
    """The advance per step (runs of equal values) and the memory limit, for AvgPipe runs."""
    lines = []
    if summary.advance_per_step:
        runs: list[_AdvanceRun] = []
        for step, advance in enumerate(summary.advance_per_step, start=1):
            if runs and runs[-1].advance == advance:
                runs[-1] = runs[-1]._replace(last=step)
            else:
                runs.append(_AdvanceRun(advance, step, step))
        text = ", ".join(f"{run.advance} (step {run.first})" if run.first == run.last
                         else f"{run.advance} (steps {run.first}-{run.last})" for run in runs)
        lines.append(f"{'advance':>24}  {text}")
    if summary.memory_limit is not None:
        peak = max((e["peak_bytes"] for e in summary.advance_log), default=None)
        counted = f" (peak counted {peak / 2**20:.1f} MiB)" if peak is not None else ""
        lines.append(f"{'memory limit (MiB)':>24}  {summary.memory_limit / 2**20:.1f}{counted}")
    return lines
