"""``pipeweave schedules``: list the registered schedules with their description and paper."""

from __future__ import annotations

import argparse
from typing import Any

from ..schedules import available_schedules

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schedules", help="list the available schedules",
        description="List every registered schedule: name, synchronous or not, description, paper.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    infos = available_schedules()
    width = max(len(info.name) for info in infos)
    for info in infos:
        kind = "sync " if info.synchronous else "async"
        print(f"{info.name:<{width}}  {kind}  {info.description}")
        print(f"{'':<{width}}         paper: {info.paper}")
    return 0
