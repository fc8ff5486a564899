"""Schedule generators: pure functions from a :class:`Shape` to a compute-only :class:`Schedule`."""

from .defaults import ScheduleDefaults, schedule_defaults
from .registry import (Shape, ScheduleInfo, available_schedules, build_schedule, get_info,
                       lowered_schedule, register)

__all__ = ["Shape", "ScheduleInfo", "available_schedules", "build_schedule", "get_info", "register",
           "lowered_schedule", "ScheduleDefaults", "schedule_defaults"]
