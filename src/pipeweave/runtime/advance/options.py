"""AdvanceOptions, re-exported where AvgPipe's online advance and its users import it from.

The record lives in :mod:`pipeweave.runtime.options.advance`, below the job that carries it
(``job.advance``), so that the job does not import this package, whose mechanics import the
job.
"""

from ..options.advance import AdvanceOptions, TimeSource

__all__ = ["AdvanceOptions", "TimeSource"]
