"""Reports of simulated and measured runs: Chrome-trace timelines and matplotlib plots.

Both exports take plain records ``(rank, action text, start, end)`` so the simulator's
timeline and the runtime's measured one share them.
"""

from .chrome_trace import Record, chrome_trace, write_chrome_trace
from .timeline_plot import plot_timeline

__all__ = ["Record", "chrome_trace", "write_chrome_trace", "plot_timeline"]
