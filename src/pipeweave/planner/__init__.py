"""Planner: turn a profile and a cluster into a plan the runtime executes.

Methods (``available_methods()``): ``uniform``, ``parameters``, ``time``, ``pipedream``
(pipedream.txt §3.1 dynamic program with replication over a hierarchical topology) and
``autopipe`` (autopipe.txt §III-B: Algorithm 1, then the simulator-driven master-stage
search); AutoPipe's Slicer (Algorithm 2) on request. ``make_plan(PlanRequest(...), method)``
returns a :class:`PlanResult` holding the :class:`~pipeweave.planner.plan.Plan` the runtime runs, the
balance, the simulated iteration time and the planning time. Pure Python + numpy: importing
the planner (or the plan) does not import torch.
"""

from .autopipe import AutoPipeSearch, autopipe_search, cooldown_violation
from .evaluate import Evaluator, Network, plan_costs
from .memory import RankMemory, predicted_memory
from .partition import Bounds, min_max_partition, uniform_partition
from .plan import Plan
from .pipedream import PipeDreamSolution, allreduce_time, noam, pipedream_partition
from .registry import MethodInfo, available_methods, get_method, make_plan, register_method
from .result import Partition, PlanRequest, PlanResult, balance
from .semantics_options import Semantics
from .topology import Level, Topology

__all__ = [
    "Plan", "Semantics", "PlanRequest", "PlanResult", "Partition", "make_plan", "available_methods", "get_method",
    "register_method", "MethodInfo", "Topology", "Level", "Bounds", "min_max_partition",
    "uniform_partition", "pipedream_partition", "PipeDreamSolution", "allreduce_time", "noam",
    "autopipe_search", "AutoPipeSearch", "cooldown_violation", "Evaluator", "Network",
    "plan_costs", "balance", "RankMemory", "predicted_memory",
]
