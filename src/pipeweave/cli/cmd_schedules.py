"""``pipeweave schedules``: list the registered schedules with their description and paper.

Each line also says how many samples one optimizer step sees, counted from the schedule itself
(:func:`pipeweave.ir.updates.update_sizes`): that is what ``--lr`` and every optimizer argument
apply to, exactly as in ``torch.optim``. The list ends with a pointer to the page that says
which schedule to use when (:data:`CHOOSING`).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..ir.updates import update_sizes
from ..schedules import ScheduleInfo, Shape, available_schedules, build_schedule

__all__ = ["add_parser", "run", "samples_per_update", "CHOOSING"]

CHOOSING = ("which schedule and semantics to use when: docs/choosing.md (measured numbers); "
            "or let `pipeweave auto` choose by simulation")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schedules", help="list the available schedules",
        description="List every registered schedule: name, synchronous or not, description, "
                    "paper, and the samples one optimizer step sees.",
    )
    parser.set_defaults(func=run)


def samples_per_update(info: ScheduleInfo) -> str:
    """What one update of ``info``'s schedule sees, in words (straight pipeline)."""
    microbatches = 4
    for chunks in (1, 2):
        try:
            schedule = build_schedule(info.name, Shape(stages=2, microbatches=microbatches,
                                                       chunks=chunks))
        except ValueError:
            continue
        sizes = set(update_sizes(schedule).values())
        if sizes == {microbatches}:
            return "one batch (--batch-size samples)" + (
                " per parallel pipeline" if info.pipelines else "")
        if sizes == {1}:
            return "one micro-batch (--batch-size / M samples)"
        return f"{sorted(sizes)} of M={microbatches} micro-batches"
    return "unknown (no small shape builds)"


def run(args: argparse.Namespace) -> int:
    infos = available_schedules()
    width = max(len(info.name) for info in infos)
    for info in infos:
        kind = "sync " if info.synchronous else "async"
        print(f"{info.name:<{width}}  {kind}  {info.description}")
        print(f"{'':<{width}}         paper: {info.paper}")
        print(f"{'':<{width}}         one update sees: {samples_per_update(info)}")
        if info.cost:
            print(f"{'':<{width}}         cost: {info.cost}")
    print(f"\n{CHOOSING}")
    return 0
