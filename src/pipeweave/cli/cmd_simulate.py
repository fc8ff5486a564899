"""``pipeweave simulate``: time a schedule with per-stage costs and print its measures.

    pipeweave simulate 1f1b --stages 4 --microbatches 8 --json
    {"schedule": "1f1b", ..., "iteration_time": 33.0, "bubble_fraction": 0.2727..., ...}

Costs default to F=1, B=2, C=0 (AutoPipe's idealised units); ``--forward``/``--backward``
take one number or one per (virtual) stage, ``--comm`` one number or one per boundary.
``--backward`` is the whole backward; ``--weight-grad`` its weight-gradient part, what a split
backward's ``W`` costs (its ``I`` costs the rest), default half the backward — so the defaults
are the zero-bubble paper's F = I = W = 1::

    pipeweave simulate zb-h1 --stages 4 --microbatches 8 --json
    {"schedule": "zb-h1", ..., "iteration_time": 27.0, ...,
     "peak_activations": [4.0, 4.0, 4.0, 4.0], ...}

``peak_activations`` (per rank) counts an activation from its forward until its weight
gradient (``B`` or ``W``): what a deferred ``W`` keeps alive.

``--model NAME`` (profiled now, ``--hf-config`` too) or ``--profile FILE`` take the costs from a
measured profile instead, the model split evenly over the schedule's stages (``Plan.uniform``'s
split): each stage's forward, backward, measured weight-gradient part, optimizer step, held
activation bytes and, with the profile's link, its transfers::

    pipeweave simulate zbv --model hf-gpt2 --stages 2 --chunks 2 --microbatches 8
``--shared-cores N``: the ranks share N CPU cores (local processes on a CPU machine); the
forwards, backwards and updates in progress at once split them.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from ..ir import Schedule
from ..report import plot_timeline, write_chrome_trace
from ..sim import Costs, SimulationResult, simulate
from .model_options import add_profile_source
from .options import (add_shape_arguments, default_iterations, profile_from_args,
                      schedule_from_args)

if TYPE_CHECKING:
    from ..planner.evaluate import Network
    from ..profiler import Profile

COST_DEFAULTS = {"forward": "1", "backward": "2", "comm": "0", "update": "0"}
"""The unit costs used without a profile (AutoPipe's idealised F=1, B=2, free transfers)."""

__all__ = ["add_parser", "run", "parse_numbers"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate a schedule: iteration time, bubble, memory, critical path",
        description="Simulate a schedule with per-stage costs (default F=1, B=2, C=0).",
    )
    add_shape_arguments(parser)
    parser.add_argument("--forward", "-F", default=None, metavar="F[,F1,...]",
                        help="forward time: one number or one per stage (default 1)")
    parser.add_argument("--backward", "-B", default=None, metavar="B[,B1,...]",
                        help="backward time: one number or one per stage (default 2)")
    parser.add_argument("--weight-grad", "-W", default=None, metavar="W[,W1,...]",
                        help="weight-gradient part of the backward, what a split backward's W "
                             "costs (its I costs B - W): one number or one per stage "
                             "(default B/2)")
    parser.add_argument("--comm", "-C", default=None, metavar="C[,C1,...]",
                        help="transfer time: one number or one per stage boundary (default 0)")
    parser.add_argument("--update", default=None, metavar="U[,U1,...]",
                        help="optimizer-step time per stage (default 0)")
    source = parser.add_argument_group(
        "costs from a model instead (give --model or --profile, not the numbers above)")
    add_profile_source(source, model_help="profile this built-in model now and split it evenly",
                       profile_help="a profile JSON (pipeweave profile --json-out FILE)",
                       batch_size_help="samples per micro-batch when profiling --model "
                                       "(default 4)",
                       device_help="where to profile --model (default cpu)")
    parser.add_argument("--shared-cores", type=int, default=None, metavar="N",
                        help="the ranks share N CPU cores (default: a device per rank)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", metavar="FILE", default=None,
                        help="write a Chrome trace (open in Perfetto / chrome://tracing)")
    parser.add_argument("--plot", metavar="FILE", default=None, help="write a PNG timeline")
    parser.set_defaults(func=run)


def parse_numbers(flag: str, text: str) -> float | list[float]:
    """One number, or a comma-separated list of numbers."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"{flag} {text!r} must be a number or comma-separated numbers, e.g. {flag} 1 or "
            f"{flag} 1,1.5,1,2"
        ) from None
    return values[0] if len(values) == 1 else values


def run(args: argparse.Namespace) -> int:
    from ..files import check_can_write

    for path, flag in ((args.trace, "--trace"), (args.plot, "--plot")):
        if path is not None:
            check_can_write(path, flag)  # before profiling or simulating
    schedule = schedule_from_args(args, default_iterations=default_iterations(args.schedule))
    from_model = (args.model is not None or args.profile is not None
                  or getattr(args, "hf_config", None) is not None)
    costs = profiled_costs(args, schedule) if from_model else unit_costs(args)
    result = simulate(schedule, costs)
    summary = result.summary()
    summary["costs"] = costs.to_json()
    if args.trace:
        write_chrome_trace(result.timeline, args.trace, name=f"{schedule.name} (simulated)")
        summary["trace"] = args.trace
    if args.plot:
        title = (f"{schedule.name}: P={schedule.num_stages}, M={schedule.microbatches}, "
                 f"K={schedule.iterations} (simulated)")
        plot_timeline(result.timeline, args.plot, title=title, time_label="time (cost units)")
        summary["plot"] = args.plot
    if args.json:
        print(json.dumps(summary))
    else:
        print(_table(result))
        for key in ("trace", "plot"):
            if key in summary:
                print(f"wrote {summary[key]}")
    return 0


def unit_costs(args: argparse.Namespace) -> Costs:
    """The costs the flags give (:data:`COST_DEFAULTS` where not given)."""
    def given(name: str) -> str:
        value = getattr(args, name)
        return COST_DEFAULTS[name] if value is None else str(value)

    return Costs(
        forward=parse_numbers("--forward", given("forward")),
        backward=parse_numbers("--backward", given("backward")),
        weight_grad=(parse_numbers("--weight-grad", args.weight_grad)
                     if args.weight_grad is not None else None),
        comm=parse_numbers("--comm", given("comm")),
        update=parse_numbers("--update", given("update")),
        shared_cores=args.shared_cores,
    )


def profiled_costs(args: argparse.Namespace, schedule: Schedule) -> Costs:
    """Costs of the model's profile split evenly over the schedule's stages (module docstring)."""
    from ..planner.evaluate import Network, plan_costs
    from ..planner.partition import uniform_partition
    from ..schedules import get_info

    given = [f"--{name.replace('_', '-')}" for name in ("forward", "backward", "weight_grad",
                                                      "comm", "update")
             if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} and a model's profile both give costs; drop "
                         f"{' and '.join(given)}, or --model/--profile")
    profile = profile_from_args(args, ranks=schedule.num_ranks)  # threads sized by the ranks
    stages = schedule.num_stages
    if profile.num_blocks < stages:
        raise ValueError(f"{profile.model} has {profile.num_blocks} blocks, fewer than the "
                         f"{stages} stages of this schedule; use fewer --stages or --chunks")
    bounds = uniform_partition(profile.num_blocks, stages)
    link = profile.link
    network = Network(bandwidth=link.bandwidth if link is not None else math.inf,
                      latency=link.latency if link is not None else 0.0,
                      shared_cores=args.shared_cores)
    costs = plan_costs(profile, bounds, network)
    if get_info(schedule.name).sliced != schedule.name:
        return costs
    return _sliced(costs, profile, bounds, network)


def _sliced(costs: Costs, profile: Profile, bounds: tuple[tuple[int, int], ...],
            network: Network) -> Costs:
    """``costs`` of a Slicer schedule with its halves priced as ``auto`` prices them: the
    profile at half the micro-batch, the runtime's fixed costs paid by each half's F
    (:func:`pipeweave.planner.slicer_halves.halves_at`), not half the whole."""
    from dataclasses import replace

    from ..planner.slicer_halves import halves_at
    from ..auto.scaling import scaled_profile
    from ..planner.evaluate import plan_costs

    sized = profile if profile.batch_size else replace(profile, batch_size=2)  # unknown: even
    assert sized.batch_size is not None
    half = scaled_profile(sized, max(1, (sized.batch_size + 1) // 2))
    return halves_at(costs, len(bounds), half, lambda p: plan_costs(p, bounds, network))


def _table(result: SimulationResult) -> str:
    s = result.schedule
    path = [str(a) for a in result.critical_path]
    shown = " ".join(path) if len(path) <= 16 else " ".join(path[:8] + ["..."] + path[-7:])
    lo, hi = result.window
    rows = [
        ("schedule", f"{s.name} ({'synchronous' if s.synchronous else 'asynchronous'}), "
                     f"{s.num_stages} stages on {s.num_ranks} ranks, M={s.microbatches}, "
                     f"K={s.iterations}"),
        ("iteration time", f"{result.iteration_time:.6g}  (makespan {result.makespan:.6g}, "
                           f"measured over [{lo:.6g}, {hi:.6g}])"),
        ("bubble fraction",
         f"{result.bubble_fraction:.4f}  ({100 * result.bubble_fraction:.2f} %)"),
        ("peak activations", "per rank: " + " ".join(f"{v:g}" for v in result.peak_activations)
         + "  (held from F until B or W)"),
        ("weight versions", "per stage: " + " ".join(str(v) for v in result.weight_versions)),
        ("master stage", str(result.master_stage)),
        ("critical path", f"{shown}  ({len(path)} actions)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
