"""``pipeweave show``: print a schedule as a rank-by-step grid (optionally lowered, or as CSV);
the shape arguments it shares with ``simulate`` are in :mod:`.options`::

    pipeweave show 1f1b --stages 3 --microbatches 4
    step       0      1      2      3      4      5      6      7      8      9     10
    rank0  0F0@0  0F1@0  0F2@0  0B0@0  0F3@0  0B1@0  0B2@0  0B3@0   0U@1
    ...
"""

from __future__ import annotations

import argparse
from typing import Any

from ..ir import lower, render_grid, schedule_to_csv
from .options import add_shape_arguments, schedule_from_args

__all__ = ["add_parser", "run"]


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
