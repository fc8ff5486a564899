"""The runtime: interprets schedules with torch, in one process or across real processes."""

from .job import BuiltinData, BuiltinModel, Job, OptimizerFactory
from .launch import RunFailed, launch_local, run_under_torchrun, under_torchrun
from .local_executor import run_local
from ..planner.plan import Plan
from .worker import RankResult

__all__ = [
    "Plan", "Job", "BuiltinModel", "BuiltinData", "OptimizerFactory", "RankResult",
    "run_local", "launch_local", "run_under_torchrun", "under_torchrun", "RunFailed",
]
