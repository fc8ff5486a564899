"""``pipeweave show``: print a schedule as a rank-by-step grid (optionally lowered, or as CSV).

Also home of the shape arguments every schedule command shares (``simulate`` reuses them)::

    pipeweave show 1f1b --stages 3 --microbatches 4
    step       0      1      2      3      4      5      6      7      8      9     10
    rank0  0F0@0  0F1@0  0F2@0  0B0@0  0F3@0  0B1@0  0B2@0  0B3@0   0U@1
    ...
"""

from __future__ import annotations

import argparse
from typing import Any

from ..ir import Schedule, lower, render_grid, schedule_to_csv
from ..schedules import Shape, build_schedule, get_info
from .options import parse_options

__all__ = [
    "add_parser", "run", "add_shape_arguments", "schedule_from_args", "default_iterations",
]


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """SCHEDULE and the shape options shared by ``show`` and ``simulate``."""
    parser.add_argument("schedule", metavar="SCHEDULE",
                        help="schedule name (see `pipeweave schedules`)")
    parser.add_argument("--stages", "-P", type=int, required=True,
                        help="pipeline depth P (ranks per pipeline copy)")
    parser.add_argument("--microbatches", "-M", type=int, required=True,
                        help="micro-batches per iteration M")
    parser.add_argument("--iterations", "-K", type=int, default=None,
                        help="iterations K (default 1; `simulate` uses 4 for asynchronous "
                             "schedules so a steady state exists)")
    parser.add_argument("--chunks", "-V", type=int, default=1,
                        help="model chunks per rank (interleaved, WPipe)")
    parser.add_argument("--replicas", default=None, metavar="R0,R1,...",
                        help="replicas per stage, comma-separated (PipeDream 1F1B-RR)")
    parser.add_argument("--width", type=int, default=1,
                        help="data-parallel copies of the whole pipeline")
    parser.add_argument("--pipelines", "-N", type=int, default=1,
                        help="parallel pipelines sharing the ranks (AvgPipe)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="generator option, repeatable (e.g. -o advance=2)")


def schedule_from_args(args: argparse.Namespace, *, default_iterations: int = 1) -> Schedule:
    """Build the schedule the shape arguments describe (library ValueErrors propagate)."""
    options = parse_options(args.option)
    iterations = args.iterations if args.iterations is not None else default_iterations
    shape = Shape(
        stages=args.stages, microbatches=args.microbatches, iterations=iterations,
        chunks=args.chunks, width=args.width, replicas=_parse_replicas(args.replicas),
        pipelines=args.pipelines, options=options,
    )
    return build_schedule(args.schedule, shape)


def default_iterations(name: str) -> int:
    """1 for a synchronous schedule, 4 for an asynchronous one (fill, 2 steady, drain)."""
    return 1 if get_info(name).synchronous else 4


def _parse_replicas(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"--replicas {text!r} must be comma-separated integers, one per stage, e.g. 2,1,1,1"
        ) from None


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show", help="print a schedule as a rank-by-step grid",
        description="Build a schedule and print its rank-by-step grid of actions.",
    )
    add_shape_arguments(parser)
    parser.add_argument("--lowered", action="store_true",
                        help="insert the sends/receives (SF/RF/SB/RB) before printing")
    parser.add_argument("--csv", metavar="FILE", default=None,
                        help="also write the schedule as CSV (one row per rank)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.csv:
        from ..files import check_can_write

        check_can_write(args.csv, "--csv")
    schedule = schedule_from_args(args)
    if args.lowered:
        schedule = lower(schedule)
    s = schedule
    print(f"{s.name}: {s.num_stages} stages on {s.num_ranks} ranks, M={s.microbatches}, "
          f"K={s.iterations}, {'synchronous' if s.synchronous else 'asynchronous'}"
          + (", lowered" if s.lowered else ""))
    print(render_grid(schedule))
    if args.csv:
        schedule_to_csv(schedule, args.csv)
        print(f"wrote {args.csv}")
    return 0
