"""CheckpointOptions, re-exported where the checkpoint code and its users import it from.

The record lives in :mod:`pipeweave.runtime.options.checkpoint`, below the job that carries it
(``job.checkpoint``), so that the job does not import this package, whose mechanics import
the job.
"""

from ..options.checkpoint import AUTO, CheckpointOptions

__all__ = ["CheckpointOptions", "AUTO"]
