"""Schedule generators: pure functions from a :class:`Shape` to a compute-only :class:`Schedule`."""

from .registry import Shape, ScheduleInfo, available_schedules, build_schedule, get_info, register

__all__ = ["Shape", "ScheduleInfo", "available_schedules", "build_schedule", "get_info", "register"]
