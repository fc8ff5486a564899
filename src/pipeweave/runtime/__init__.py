"""The runtime: interprets schedules with torch, in one process or across real processes."""

from .job import BuiltinData, BuiltinModel, Job, OptimizerFactory
from .launch.processes import RunFailed, launch_local, run_under_torchrun, under_torchrun
from .launch.single_process import run_local
from ..planner.plan import Plan
from .observation.results import RankResult

__all__ = [
    "Plan", "Job", "BuiltinModel", "BuiltinData", "OptimizerFactory", "RankResult",
    "run_local", "launch_local", "run_under_torchrun", "under_torchrun", "RunFailed",
]
