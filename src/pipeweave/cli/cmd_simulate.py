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
``--shared-cores N``: the ranks share N CPU cores (local processes on a CPU machine); the
forwards, backwards and updates in progress at once split them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..report import plot_timeline, write_chrome_trace
from ..sim import Costs, SimulationResult, simulate
from .cmd_show import add_shape_arguments, default_iterations, schedule_from_args

__all__ = ["add_parser", "run", "parse_numbers"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate a schedule: iteration time, bubble, memory, critical path",
        description="Simulate a schedule with per-stage costs (default F=1, B=2, C=0).",
    )
    add_shape_arguments(parser)
    parser.add_argument("--forward", "-F", default="1", metavar="F[,F1,...]",
                        help="forward time: one number or one per stage (default 1)")
    parser.add_argument("--backward", "-B", default="2", metavar="B[,B1,...]",
                        help="backward time: one number or one per stage (default 2)")
    parser.add_argument("--weight-grad", "-W", default=None, metavar="W[,W1,...]",
                        help="weight-gradient part of the backward, what a split backward's W "
                             "costs (its I costs B - W): one number or one per stage "
                             "(default B/2)")
    parser.add_argument("--comm", "-C", default="0", metavar="C[,C1,...]",
                        help="transfer time: one number or one per stage boundary (default 0)")
    parser.add_argument("--update", default="0", metavar="U[,U1,...]",
                        help="optimizer-step time per stage (default 0)")
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
    schedule = schedule_from_args(args, default_iterations=default_iterations(args.schedule))
    costs = Costs(
        forward=parse_numbers("--forward", args.forward),
        backward=parse_numbers("--backward", args.backward),
        weight_grad=(parse_numbers("--weight-grad", args.weight_grad)
                     if args.weight_grad is not None else None),
        comm=parse_numbers("--comm", args.comm),
        update=parse_numbers("--update", args.update),
        shared_cores=args.shared_cores,
    )
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
