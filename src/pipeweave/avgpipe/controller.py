"""Algorithm 1 of avgpipe.txt (§4.2): choose how many forwards to run in advance, at run time.

The paper's loop on the first GPU::

    1: advance_num <- K - 1                      // equivalent to 1F1B
    2: while next_batch() do
    3-4:   forward advance_num micro-batches      // forward in advance
    5-7:   interleave the rest (forward, backward)
    8-9:   if is_faster() and is_mem_available() then
    10:      advance_num++

pipeweave's ``advance`` counts the forwards *beyond* 1F1B's warm-up (``schedules/avgpipe.py``),
so line 1 is ``advance = 0`` and ``advance = M - 1`` is AFAB. :class:`AdvanceController` is
lines 1 and 8-10 as a state machine: the caller runs an iteration with :attr:`advance`
(lines 2-7), reports its time and peak memory to :meth:`~AdvanceController.next_advance`, and
runs the next iteration with the advance it returns.

Three things the paper leaves open, decided here:

* **is_mem_available** predicts the next step's peak as this step's plus the growth per
  advance seen on the last raise (one more micro-batch held; ``step_bytes`` gives it before
  any raise). An observed peak over the limit steps back at once.
* **stopping**: when an iteration is not faster (by more than ``tolerance``) than the best so
  far, or the memory would not fit, the controller settles on the *best* advance seen (the
  smallest one reaching that time), i.e. it steps back from a raise that did not pay.
* **plateaus**: gains can come every other step (on two ranks the simulated time falls at
  advance 2, 4, 6, not at 1, 3, 5), so ``patience`` raises that are not faster are tolerated
  before settling; ``patience=0`` is the paper's literal rule.

A settled controller keeps its advance. Measured times are noisy: use ``tolerance`` around
0.02 and ``samples`` > 1 (the median of that many iterations per step) on real runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["AdvanceController", "AdvanceStep", "run_controller"]


@dataclass(frozen=True)
class AdvanceStep:
    """One observation: the advance used, what it measured, and what the controller did.

    ``decision`` is ``"raise"`` (faster and memory allows: line 10), ``"probe"`` (not faster,
    raising within ``patience``), ``"settle"`` (settled on ``next_advance``, with ``reason``)
    or ``"hold"`` (already settled, or collecting ``samples``).
    """

    advance: int
    iteration_time: float
    peak_memory: float
    decision: str
    next_advance: int
    reason: str = ""


class AdvanceController:
    """Algorithm 1 as a state machine (module docstring).

    Args:
        limit_bytes: the user's memory limit (per device).
        max_advance: the largest advance (``M - 1`` = AFAB).
        step_bytes: expected extra peak bytes per advance (one micro-batch's activations);
            learned from the first raise when not given.
        patience: raises that are not faster tolerated before settling (0: paper's rule).
        tolerance: relative gain an iteration must show to count as faster.
        samples: iterations measured per advance (their median is used).
    """

    def __init__(self, limit_bytes: float, max_advance: int, *, step_bytes: float | None = None,
                 patience: int = 1, tolerance: float = 0.0, samples: int = 1) -> None:
        if not limit_bytes > 0:
            raise ValueError(f"limit_bytes must be > 0, got {limit_bytes!r}; give the memory "
                             "limit per device in bytes (e.g. --memory-limit 8e9)")
        if isinstance(max_advance, bool) or not isinstance(max_advance, int) or max_advance < 0:
            raise ValueError(f"max_advance must be an integer >= 0 (M - 1 reaches AFAB), "
                             f"got {max_advance!r}")
        if step_bytes is not None and step_bytes < 0:
            raise ValueError(f"step_bytes must be >= 0, got {step_bytes!r}")
        if patience < 0 or samples < 1 or not 0 <= tolerance < 1:
            raise ValueError(f"need patience >= 0, samples >= 1 and 0 <= tolerance < 1, got "
                             f"patience={patience}, samples={samples}, tolerance={tolerance}")
        self.limit_bytes = float(limit_bytes)
        self.max_advance = max_advance
        self.step_bytes = step_bytes
        self.patience = patience
        self.tolerance = tolerance
        self.samples = samples
        self.advance = 0                       # line 1: advance_num <- K - 1 (1F1B)
        self.settled = False
        self.history: list[AdvanceStep] = []
        self._best: tuple[int, float] | None = None     # (advance, time)
        self._peaks: dict[int, float] = {}
        self._strikes = 0
        self._pending: list[tuple[float, float]] = []

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the next advances, as plain JSON data (a checkpoint's):
        the settings, :attr:`advance`, :attr:`settled`, the history and the measurements
        the next decisions compare against. :meth:`load_state_dict` puts it back."""
        return {"limit_bytes": self.limit_bytes, "max_advance": self.max_advance,
                "step_bytes": self.step_bytes, "patience": self.patience,
                "tolerance": self.tolerance, "samples": self.samples,
                "advance": self.advance, "settled": self.settled,
                "history": [asdict(step) for step in self.history],
                "best": None if self._best is None else list(self._best),
                "peaks": [[a, p] for a, p in sorted(self._peaks.items())],
                "strikes": self._strikes, "pending": [list(m) for m in self._pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a controller with the same settings (else
        ValueError naming the settings that differ)."""
        keys = ("limit_bytes", "max_advance", "step_bytes", "patience", "tolerance", "samples")
        differ = {k: (state[k], getattr(self, k)) for k in keys if state[k] != getattr(self, k)}
        if differ:
            raise ValueError(f"the saved advance controller ran with other settings "
                             f"(saved, here): {differ}; continue it with the settings it was "
                             f"saved with, or start a new run")
        self.advance, self.settled = int(state["advance"]), bool(state["settled"])
        self.history = [AdvanceStep(**step) for step in state["history"]]
        best = state["best"]
        self._best = None if best is None else (int(best[0]), float(best[1]))
        self._peaks = {int(a): float(p) for a, p in state["peaks"]}
        self._strikes = int(state["strikes"])
        self._pending = [(float(t), float(p)) for t, p in state["pending"]]

    @property
    def best_advance(self) -> int:
        """The advance with the fastest iteration seen (0 before any observation)."""
        return self._best[0] if self._best is not None else 0

    def next_advance(self, iteration_time: float, peak_memory: float | Sequence[float]) -> int:
        """Report one iteration run with :attr:`advance`; returns the advance for the next."""
        peak = float(max(peak_memory)) if isinstance(peak_memory, Sequence) else float(peak_memory)
        if not iteration_time > 0:
            raise ValueError(f"iteration_time must be > 0, got {iteration_time!r}")
        if self.settled:
            return self._record(self.advance, iteration_time, peak, "hold", self.advance, "settled")
        self._pending.append((iteration_time, peak))
        if len(self._pending) < self.samples:
            return self._record(self.advance, iteration_time, peak, "hold", self.advance,
                                "sampling")
        time_ = statistics.median(t for t, _ in self._pending)
        peak = max(p for _, p in self._pending)
        self._pending.clear()
        return self._decide(time_, peak)

    # -- lines 8-10 ---------------------------------------------------------------------
    def _decide(self, time_: float, peak: float) -> int:
        a = self.advance
        self._peaks[a] = peak
        if peak > self.limit_bytes:
            # over the limit (possible only after a raise whose growth was not yet known)
            return self._settle(a, time_, peak, self.best_advance if a else 0,
                                f"peak {peak:.0f} B over the limit {self.limit_bytes:.0f} B")
        if self._is_faster(time_):                                   # is_faster()
            self._best, self._strikes = (a, time_), 0
            decision = "raise"
        else:
            self._strikes += 1
            if self._strikes > self.patience:
                return self._settle(a, time_, peak, self.best_advance, "not faster")
            decision = "probe"
        if a >= self.max_advance:
            return self._settle(a, time_, peak, self.best_advance, "reached AFAB (max_advance)")
        if not self._is_mem_available(a, peak):                      # is_mem_available()
            return self._settle(a, time_, peak, self.best_advance,
                                f"advance {a + 1} would exceed {self.limit_bytes:.0f} B")
        self.advance = a + 1                                         # advance_num++
        return self._record(a, time_, peak, decision, self.advance)

    def _is_faster(self, time_: float) -> bool:
        return self._best is None or time_ < self._best[1] * (1.0 - self.tolerance)

    def _is_mem_available(self, advance: int, peak: float) -> bool:
        growth = self.step_bytes
        if advance > 0 and advance - 1 in self._peaks:
            growth = max(self._peaks[advance] - self._peaks[advance - 1], growth or 0.0)
        if growth is None:
            return True  # unknown until the first raise; an observed excess steps back
        return peak + growth <= self.limit_bytes

    def _settle(self, used: int, time_: float, peak: float, advance: int, reason: str) -> int:
        self.settled = True
        self.advance = advance
        return self._record(used, time_, peak, "settle", advance, reason)

    def _record(self, used: int, time_: float, peak: float, decision: str, next_advance: int,
                reason: str = "") -> int:
        self.history.append(AdvanceStep(used, time_, peak, decision, next_advance, reason))
        return next_advance


def run_controller(controller: AdvanceController,
                   measure: Callable[[int], tuple[float, float | Sequence[float]]],
                   iterations: int) -> list[AdvanceStep]:
    """Drive ``controller`` for ``iterations`` iterations: ``measure(advance)`` runs (or
    simulates) one iteration and returns ``(iteration time, peak memory)``. Stops early once
    settled. Returns the history."""
    for _ in range(iterations):
        time_, peak = measure(controller.advance)
        controller.next_advance(time_, peak)
        if controller.settled:
            break
    return list(controller.history)
