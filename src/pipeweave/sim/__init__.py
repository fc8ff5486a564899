"""Discrete-event simulator: times a schedule's action lists with per-action costs.

``simulate(schedule, costs)`` gives the timeline, iteration time, bubble fraction, peak held
activations and weight versions, the critical path and AutoPipe's master stage;
``simulate_timing`` the timing alone (for searches). Pure Python,
no torch: the planners call it in their search loops.
"""

from .costs import Costs, StageCosts
from .critical_path import critical_path, master_stage
from .simulator import (PathTiming, SimulationResult, TimelineRecord, Timing, simulate,
                        simulate_path, simulate_timing)

__all__ = [
    "Costs", "StageCosts", "SimulationResult", "TimelineRecord", "simulate", "critical_path",
    "master_stage", "Timing", "simulate_timing", "PathTiming", "simulate_path",
]
