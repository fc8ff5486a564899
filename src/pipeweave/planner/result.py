"""What every planner is asked (:class:`PlanRequest`) and what it answers (:class:`PlanResult`).

A planner method turns a request into a :class:`Partition` (stage bounds, replicas, schedule,
its own numbers); :func:`pipeweave.planner.make_plan` times it, turns it into a runtime
:class:`~pipeweave.planner.plan.Plan`, simulates it and wraps everything in a
:class:`PlanResult` — the report ``pipeweave plan --json`` prints::

    {"method": "autopipe", "stages": [[0, 4], [4, 10]], "replicas": [1, 1],
     "balance": 1.02, "predicted_iteration_time": 0.0123, "planning_seconds": 0.004, ...}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..profiler import Profile
from .plan import Plan
from ..sim.costs import check_shared_cores
from .evaluate import Network
from .partition import Bounds
from .topology import Topology

__all__ = ["PlanRequest", "check_request", "Partition", "PlanResult", "balance"]


def check_request(*, ranks: object, microbatches: object = None, memory_limit: object = None,
                  topology: Topology | None = None, shared_cores: object = None) -> None:
    """The checks of a :class:`PlanRequest` that need no profile, so that a command line can
    run them before it profiles anything."""
    check_shared_cores(shared_cores)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if microbatches is not None and (isinstance(microbatches, bool)
                                     or not isinstance(microbatches, int) or microbatches < 1):
        raise ValueError(f"microbatches must be an integer >= 1, got {microbatches!r}")
    if memory_limit is not None and not (memory_limit > 0):  # type: ignore[operator]
        raise ValueError(f"memory_limit must be > 0 bytes, got {memory_limit!r}")
    if topology is not None and topology.workers != ranks:
        raise ValueError(
            f"the topology {topology} has {topology.workers} workers but ranks is "
            f"{ranks}; make the product of the machine counts equal --ranks"
        )


@dataclass(frozen=True)
class PlanRequest:
    """A planning problem.

    Attributes:
        profile: per-block costs (see :mod:`pipeweave.profiler`).
        ranks: workers (processes / devices) to use.
        microbatches: M, micro-batches per iteration (default ``2 * ranks``).
        memory_limit: bytes available per worker; ``None``: unlimited.
        topology: hierarchical levels for PipeDream (default: one level of ``ranks`` workers
            at the profile's measured link bandwidth, or free communication without one).
        straight: PipeDream without stage replication.
        slicer: AutoPipe's Slicer: run ``sliced-1f1b`` with Algorithm 2's ``k``.
        schedule: override the method's default schedule.
        allreduce_overlap: PipeDream's ``max(compute, all-reduce)`` (True, the paper) or their
            sum (False, PipeDream's released optimizer).
        shared_cores: the ranks will share this many CPU cores (local processes on a CPU
            machine with fewer cores than ranks): plans are simulated with the cores split
            among the ranks computing at once. ``None``: every rank has its own device.
        half_profile: with ``slicer``, the model's profile at half the micro-batch
            (``ceil(b / 2)`` samples, measured or scaled): Algorithm 2's ``k`` and the
            simulated iteration price a half by it (:func:`.slicer_halves.halves_at`, the
            rule of ``pipeweave auto`` and ``simulate``). ``None``: a half costs half the
            whole (the paper's).
    """

    profile: Profile
    ranks: int
    microbatches: int | None = None
    memory_limit: float | None = None
    topology: Topology | None = None
    straight: bool = False
    slicer: bool = False
    schedule: str | None = None
    allreduce_overlap: bool = True
    shared_cores: int | None = None
    half_profile: Profile | None = None

    def __post_init__(self) -> None:
        check_request(ranks=self.ranks, microbatches=self.microbatches,
                      memory_limit=self.memory_limit, topology=self.topology,
                      shared_cores=self.shared_cores)
        half = self.half_profile
        if half is not None and not self.slicer:
            raise ValueError("half_profile prices the Slicer's halves; give slicer=True "
                             "(--slicer) or drop it")
        if half is not None and half.num_blocks != self.profile.num_blocks:
            raise ValueError(f"half_profile has {half.num_blocks} blocks but the profile "
                             f"{self.profile.num_blocks}; give a profile of the same model")

    @property
    def num_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.ranks

    def resolved_topology(self) -> Topology:
        if self.topology is not None:
            return self.topology
        link = self.profile.link
        return Topology.single(self.ranks, link.bandwidth if link is not None else math.inf)

    @property
    def latency(self) -> float:
        return self.profile.link.latency if self.profile.link is not None else 0.0


@dataclass(frozen=True)
class Partition:
    """A method's answer before it becomes a plan."""

    bounds: Bounds
    schedule: str
    replicas: tuple[int, ...] | None = None
    microbatches: int | None = None
    schedule_options: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    network: Network | None = None
    """Links the plan is simulated with (default: a straight pipeline on the topology)."""


def balance(stage_times: tuple[float, ...] | list[float]) -> float:
    """max / mean of the stage times (1.0 is perfect; DESIGN.md "Measures")."""
    mean = sum(stage_times) / len(stage_times)
    return max(stage_times) / mean if mean > 0 else 1.0


@dataclass(frozen=True)
class PlanResult:
    """A plan and what the planner predicts for it.

    Attributes:
        method: the planner method's name.
        plan: the runtime plan (``Plan.save`` writes what ``pipeweave train --plan`` reads).
        stage_times: per stage, forward + backward time of one micro-batch divided by the
            stage's replicas (PipeDream: including its all-reduce, see ``details``).
        predicted_iteration_time: simulated seconds per iteration of M micro-batches.
        planning_seconds: wall time the method took.
        details: method-specific numbers (PipeDream's time per minibatch and NOAM, AutoPipe's
            Algorithm 1 start and simulator calls, the Slicer's k, ...).
    """

    method: str
    plan: Plan
    stage_times: tuple[float, ...]
    predicted_iteration_time: float
    planning_seconds: float
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def balance(self) -> float:
        return balance(self.stage_times)

    @property
    def balance_std(self) -> float:
        """Standard deviation of the stage times over their mean (AutoPipe's measure)."""
        mean = statistics.fmean(self.stage_times)
        return statistics.pstdev(self.stage_times) / mean if mean > 0 else 0.0

    @property
    def replicas(self) -> tuple[int, ...]:
        return self.plan.replicas if self.plan.replicas is not None else (1,) * len(self.plan.stages)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "stages": [list(s) for s in self.plan.stages],
            "replicas": list(self.replicas),
            "schedule": self.plan.schedule,
            "microbatches": self.plan.microbatches,
            "balance": self.balance,
            "balance_std": self.balance_std,
            "stage_times": list(self.stage_times),
            "predicted_iteration_time": self.predicted_iteration_time,
            "planning_seconds": self.planning_seconds,
            **dict(self.details),
            "plan": self.plan.to_json(),
        }
