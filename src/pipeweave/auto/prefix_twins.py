"""Recompute prefixes pruned before their partition, by their twin recomputing fewer stages.

A candidate recomputing the first ``k`` stages and one recomputing the first ``j <= k``,
the same otherwise (schedule, shape, M, method, APC, sharding), get the same partition (the
partition methods are asked for the stage count and the micro-batches, never for the
recomputation, :mod:`~pipeweave.auto.partitioning`) and so the same plan but for ``k - j``
more recomputing stages, when the schedule takes no option the search fills from the costs
(the Slicer's, :data:`~pipeweave.auto.predict.OPTION_PROVIDERS`, which read the recomputed
backwards). Recomputation only lengthens backwards, and every start in the simulator is a
maximum of ends plus delays, so the ``k`` plan's time is at least the ``j`` plan's
(``search._Search.twin_bound``, the same premise after partitioning;
``tests/auto/test_pruning_exact.py`` checks it on every synchronous schedule). Any lower
bound of the ``j`` plan's time (its plan bound, its twin bound, its simulated time) is then
one of the ``k`` plan's::

    time(k)  >=  time(j)  >=  bound(j)        for every j <= k of the same group

:class:`PrefixTwins` keeps, per group (the candidate less its recomputation), the largest
such bound per recompute count, so a prefix whose twin without recomputation was pruned by
its plan bound, or simulated slower than the best, is pruned with no partition, no plan and
no costs built. Not with shared cores, whose slowdowns are not monotone in the durations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..schedules import get_info
from .predict import OPTION_PROVIDERS
from .problem import AutoProblem, Candidate
from .ranking import identity

__all__ = ["PrefixTwins"]

Group = tuple[object, ...]


@dataclass
class PrefixTwins:
    """Lower bounds of iteration times per group of recompute prefixes (module docstring)."""

    problem: AutoProblem
    groups: dict[Group, dict[int, float]] = field(default_factory=dict)
    """Per group: recompute count -> the largest lower bound recorded for that plan."""

    def _group(self, candidate: Candidate) -> Group | None:
        """The candidate less its recomputation and partition; None where the premise
        does not hold (shared cores, an asynchronous schedule, options filled from costs)."""
        cores = self.problem.shared_cores
        if cores is not None and cores < self.problem.ranks:
            return None
        info = get_info(candidate.schedule)
        if not info.synchronous or any(name in OPTION_PROVIDERS for name in info.options):
            return None
        return identity(replace(candidate, recompute=0, bounds=None, replicas=None,
                                options={}))

    def record(self, candidate: Candidate, time_bound: float) -> None:
        """``time_bound`` is at most the iteration time of ``candidate``'s plan."""
        group = self._group(candidate)
        if group is None or not time_bound > 0:
            return
        counts = self.groups.setdefault(group, {})
        count = candidate.recompute
        counts[count] = max(counts.get(count, 0.0), time_bound)

    def bound(self, candidate: Candidate) -> float:
        """A lower bound of ``candidate``'s iteration time from the twins recorded that
        recompute a prefix of its recomputing stages (0 when none is)."""
        group = self._group(candidate)
        if group is None:
            return 0.0
        counts = self.groups.get(group, {})
        return max((time for count, time in counts.items() if count <= candidate.recompute),
                   default=0.0)
