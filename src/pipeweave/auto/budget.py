"""What one candidate costs the search, estimated before it is simulated (``--time-limit``).

The simulator and the memory model are linear in the actions of the schedule they walk, so a
candidate's cost is ``units x seconds per unit``, with::

    units = depth x chunks x N x M / w     (one data-parallel copy, auto/copies.py)
          = depth x chunks x N x M         (otherwise: every copy is walked)

The seconds per unit are measured on the candidates already done, separately for the
simulation and for the memory model (the larger rate seen so far: the estimate errs long).
Under ``--time-limit`` a candidate whose estimate does not fit in the time left is skipped and
counted (``over_budget``); a cheaper one after it may still fit. Before anything is measured
nothing is skipped. Without ``--time-limit`` nothing is ever skipped, so the search is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from .problem import Candidate

__all__ = ["Budget", "work_units"]


def work_units(candidate: Candidate) -> int:
    """Actions (up to a constant) the simulator and the memory model walk for ``candidate``."""
    per_copy = candidate.depth * candidate.chunks * candidate.pipelines * candidate.microbatches
    if candidate.width > 1 and candidate.microbatches % candidate.width == 0:
        return max(1, per_copy // candidate.width)
    return max(1, per_copy)


@dataclass
class Budget:
    """Seconds per work unit, measured (module docstring)."""

    simulation: float = 0.0
    memory: float = 0.0

    def record_simulation(self, candidate: Candidate, seconds: float) -> None:
        self.simulation = max(self.simulation, seconds / work_units(candidate))

    def record_memory(self, candidate: Candidate, seconds: float) -> None:
        self.memory = max(self.memory, seconds / work_units(candidate))

    def estimate(self, candidate: Candidate, *, simulation: bool = True) -> float:
        """Seconds ``candidate`` is expected to take (0 before anything is measured):
        simulation and memory model, or the memory model alone (``simulation=False``)."""
        rate = (self.simulation if simulation else 0.0) + self.memory
        return rate * work_units(candidate)

    def fits(self, candidate: Candidate, left: float, *, simulation: bool = True) -> bool:
        return self.estimate(candidate, simulation=simulation) <= left
