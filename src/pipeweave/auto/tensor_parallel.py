"""The ``tp`` axis: one search per tensor-parallel size, each on its own problem.

With ``tp = T`` every rank of the ``pp x dp`` pipeline grid is ``T`` processes on ``T``
workers (``d * w * T = ranks``). Tensor parallelism runs an all-reduce in every split block,
so its ``T`` processes sit inside the topology's fastest, lowest level (the runtime numbers
them consecutively: process ``r * T + t``): ``T`` must divide that level's machines, which
become ``m_1 / T`` pipeline ranks each; the levels above are unchanged. The problem of size
``T`` is then an ordinary one (:func:`tp_problem`):

* ``ranks / T`` pipeline ranks on that topology;
* the profile as one of the ``T`` processes sees it (:func:`pipeweave.planner.tp_costs.
  tp_profile`, its all-reduces at the lowest level's bandwidth and the profile's link
  latency; the view is taken at the profile's micro-batch and scaled with the candidate's
  like every block cost, :mod:`.scaling`), so every bound, floor and the memory model read
  it exactly as the simulator does, and the pruned search's proofs hold per size;
* ranks sharing ``C`` CPU cores (``shared_cores``): a pipeline rank's ``T`` processes
  compute together on ``T`` of them, so the pipeline ranks share ``C / T`` groups (a size
  above ``C`` is not searched: its processes could not compute at once);
* what the runtime refuses with ``tp > 1`` is not offered: APC and AvgPipe's parallel
  pipelines (one value each), and plans that the plan's own check refuses (asynchronous
  schedules, PipeDream's replicated stages) are counted invalid.

A size is searched only where the profile records the split
(:func:`~pipeweave.planner.tp_costs.tp_ready`) and the model has no tied parameters; that
the model's blocks can be split at ``T`` (the heads) is the caller's check
(``pipeweave auto --model`` asks the runtime's ``check_parallelizable``). The same global
batch ``B`` holds for every size. No torch.
"""

from __future__ import annotations

from dataclasses import replace

from ..planner.topology import Level, Topology
from ..planner.tp_costs import tp_profile, tp_ready
from ..profiler import Profile
from .links import default_topology
from .problem import AutoProblem

__all__ = ["tp_problem", "tp_refusal", "tp_sizes"]


def tp_sizes(problem: AutoProblem) -> tuple[int, ...]:
    """The tensor-parallel sizes to search, ascending (``problem.tp``, default 1)."""
    return tuple(sorted(set(problem.tp or (1,))))


def tp_refusal(problem: AutoProblem, tp: int) -> str | None:
    """Why size ``tp`` cannot be searched (``None``: it can)."""
    if tp == 1:
        return None
    topology = problem.topology or default_topology(problem.profile, problem.ranks)
    lowest = topology.levels[0].machines
    if problem.ranks % tp or lowest % tp:
        return (f"tp={tp} does not divide the {lowest} workers of the topology's fastest "
                f"level (tensor parallelism stays inside it)")
    cores = problem.shared_cores
    if cores is not None and cores < tp:
        return (f"tp={tp} on {cores} shared CPU cores: a pipeline rank's {tp} processes could "
                f"not compute at once (the split assumes they do)")
    if not tp_ready(problem.profile):
        return (f"tp={tp}: the profile of {problem.profile.model!r} records no tensor-parallel "
                f"split; profile the model again (pipeweave profile)")
    if problem.profile.ties:
        return f"tp={tp}: tied parameters are not split yet (docs/sharding.md)"
    return None


def tp_problem(problem: AutoProblem, tp: int) -> AutoProblem:
    """The problem of size ``tp`` (module docstring); ``problem`` itself for ``tp = 1``."""
    refused = tp_refusal(problem, tp)
    if refused is not None:
        raise ValueError(refused)
    if tp == 1:
        return replace(problem, tp=(1,))
    topology = problem.topology or default_topology(problem.profile, problem.ranks)
    lowest, *rest = topology.levels
    link = problem.profile.link
    latency = link.latency if link is not None else 0.0

    def view(whole: Profile) -> Profile:
        return tp_profile(whole, tp, bandwidth=lowest.bandwidth, latency=latency)

    return replace(
        problem, profile=view(problem.profile), batch_size=problem.batch,
        extra_profiles=tuple(view(p) for p in problem.extra_profiles),
        ranks=problem.ranks // tp, tp=(tp,), apc=(False,), pipelines=(1,),
        shared_cores=None if problem.shared_cores is None else problem.shared_cores // tp,
        topology=Topology((Level(lowest.machines // tp, lowest.bandwidth), *rest)))
