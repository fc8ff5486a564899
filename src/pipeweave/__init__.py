"""pipeweave: pipeline-parallel training for PyTorch.

profile -> plan -> schedule -> simulate | run -> report. Schedules are plain data
(:mod:`pipeweave.ir`, :mod:`pipeweave.schedules`); the simulator (:mod:`pipeweave.sim`) and
the runtime (:mod:`pipeweave.runtime`) are two interpreters of the same action lists.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
