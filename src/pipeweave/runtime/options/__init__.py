"""The option records a :class:`~pipeweave.runtime.job.Job` carries: plain, picklable data,
below the job and below the packages whose mechanics read them (checkpoints, AvgPipe's online
advance), so the job imports none of those packages."""

from .advance import AdvanceOptions, TimeSource
from .checkpoint import AUTO, CheckpointOptions

__all__ = ["AdvanceOptions", "TimeSource", "CheckpointOptions", "AUTO"]
