"""Stage bounds for a candidate, from the planner's registered partition methods.

Each method (``pipeweave plan --method``) is asked for ``depth * chunks`` stages of the profile
scaled to the candidate's micro-batch, exactly as ``pipeweave plan`` would ask it for that
many ranks, with the micro-batches one data-parallel copy runs. PipeDream's dynamic program may replicate stages; it is asked for replication only
where the candidate's shape can hold it (one chunk, one copy: its replicas are the copies) and
for a straight split otherwise. Answers are cached: many candidates share a split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..planner import get_method
from ..planner.result import Partition, PlanRequest
from ..profiler import Profile
from .problem import AutoProblem, Candidate

__all__ = ["Partitioner"]


@dataclass
class Partitioner:
    """Runs and caches the partition methods for one problem."""

    problem: AutoProblem
    cache: dict[tuple[object, ...], Partition | str] = field(default_factory=dict)

    def __call__(self, candidate: Candidate, profile: Profile) -> Partition:
        """The method's partition (ValueError with the method's reason when it has none)."""
        replicate = candidate.chunks == 1 and candidate.width == 1
        per_copy = -(-candidate.microbatches // candidate.width)  # what one copy pipelines
        key = (candidate.method, candidate.stages, per_copy, profile.batch_size, replicate)
        if key not in self.cache:
            request = PlanRequest(
                profile=profile, ranks=candidate.stages, microbatches=per_copy,
                topology=self.problem.topology if replicate and candidate.stages ==
                self.problem.ranks else None,
                straight=not replicate, shared_cores=self.problem.shared_cores)
            try:
                self.cache[key] = get_method(candidate.method).run(request)
            except ValueError as error:
                self.cache[key] = str(error)
        answer = self.cache[key]
        if isinstance(answer, str):
            raise ValueError(answer)
        return answer
