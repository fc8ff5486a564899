"""Schedule intermediate representation: actions, layouts, schedules, dependencies, lowering,
validation and the timed walk. Pure Python, no torch."""

from .actions import (CHECK_OPS, COMM_OPS, COMPUTE_OPS, CORE_OPS, GRADIENT_OPS, WEIGHT_GRADIENT_OPS,
                      Action, Op, parse_action)
from .deps import collective_key, dependencies, ref
from .layout import Layout
from .lower import lower
from .schedule import Schedule, render_grid, schedule_from_csv, schedule_to_csv
from .validate import validate
from .walk import ScheduleError, Walk, walk

__all__ = [
    "Action", "Op", "parse_action", "COMPUTE_OPS", "CORE_OPS", "COMM_OPS", "GRADIENT_OPS",
    "WEIGHT_GRADIENT_OPS", "CHECK_OPS", "Layout", "Schedule",
    "render_grid", "schedule_to_csv", "schedule_from_csv", "dependencies", "ref",
    "collective_key", "lower", "validate", "ScheduleError", "Walk", "walk",
]
