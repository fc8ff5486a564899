"""The runtime: interprets schedules with torch, in one process or across real processes.

The public API: a :class:`Job` (plan, model, data and optimizer factories), its two
executors (:func:`run_local`, :func:`launch_local`; :func:`run_under_torchrun`) and what they
return, one :class:`RankResult` per rank, read with :func:`iteration_losses` and
:func:`merged_parameters`; a checkpoint's weights exported (:func:`export_checkpoint`) and
read back (:func:`load_exported`).
"""

from .checkpoint.export import export_checkpoint, load_exported
from .job import BuiltinData, BuiltinModel, Job, OptimizerFactory
from .launch.processes import RunFailed, launch_local, run_under_torchrun, under_torchrun
from .launch.single_process import run_local
from ..planner.plan import Plan
from .observation.results import RankResult, merged_parameters
from .observation.summary import iteration_losses

__all__ = [
    "Plan", "Job", "BuiltinModel", "BuiltinData", "OptimizerFactory", "RankResult",
    "run_local", "launch_local", "run_under_torchrun", "under_torchrun", "RunFailed",
    "iteration_losses", "merged_parameters", "export_checkpoint", "load_exported",
]
