"""AutoPipe's planner: Algorithm 1, then the simulator-driven heuristic search (autopipe.txt §III-B).

Algorithm 1 (:func:`pipeweave.planner.partition.min_max_partition` on ``f_i + b_i``) gives a
balanced start. Its max stage time is optimal, but two partitions with the same heaviest stage
can have different iteration times: what matters is *where* the heaviest stage — the master
stage, the one the critical path follows through the 1F1B phase — sits, and how the stages after
it are loaded (Fig. 7). The search, with ``i`` the master stage of the scheme at hand:

1. Start from Algorithm 1's scheme; simulate it (iteration time, master stage).
2. Cooldown rule, eq. (1): the stages after the master must not leave bubbles in the Cooldown
   phase, i.e. for every ``s > i``::

       sum_{j=i+1..s} (f_j + b_j)  <=  (s - i) b_i

   While some ``s`` violates it, move the last block of stage ``s`` to stage ``s+1`` (the load
   drifts towards the last stage) and re-simulate; if the master stage changes, stop adjusting.
3. If ``i = 0`` this scheme is done. Otherwise move the master stage forward: move the first
   block of stage ``i`` to stage ``i-1`` (also: then re-balance stages ``0..i-1`` with
   Algorithm 1), or move its last block to stage ``i+1`` (also: then re-balance stages
   ``0..i`` with Algorithm 1). Simulate the four candidates; those whose master stage is
   ``<= i`` go back to step 2.

The same total load, placed differently (1F1B, P=4, M=4, F = load, B = 2 load, simulated)::

    stage loads         master stage   iteration time
    1   1   2   1             2              31      (a) heaviest stage late
    1   2   1   1             1              29      (b) master moved forward
    2   1   1   1             0              27
    1   2   1.5 0.5           1              30      breaks eq. (1) at s = 2: 4.5 > 1 x 4
    1   2   0.5 1.5           1              29      (c) eq. (1) holds

The answer is the simulated-fastest scheme seen (ties: the smaller heaviest stage), so it is
never slower than Algorithm 1's. Schemes are memoised; ``max_simulations`` bounds the search.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .partition import Bounds, FeasibleFn, min_max_partition, stage_sums

__all__ = ["AutoPipeSearch", "SearchStep", "autopipe_search", "cooldown_violation"]


class Measured(Protocol):
    """What the search reads of a simulation (:class:`pipeweave.sim.SimulationResult`, or
    :class:`pipeweave.sim.PathTiming` alone)."""

    @property
    def iteration_time(self) -> float: ...

    @property
    def master_stage(self) -> int: ...


class SearchStep(NamedTuple):
    """One scheme the search simulated."""

    step: str
    """Why it was simulated: ``algorithm1``, ``queued``, ``cooldown`` or ``shift``."""
    master_stage: int
    iteration_time: float


@dataclass(frozen=True)
class AutoPipeSearch:
    """Outcome of the heuristic search.

    Attributes:
        bounds: the fastest scheme found.
        result: its simulation.
        start: Algorithm 1's scheme.
        start_result: its simulation.
        simulations: distinct schemes simulated.
        trace: every scheme simulated, in order.
    """

    bounds: Bounds
    result: Measured
    start: Bounds
    start_result: Measured
    simulations: int
    trace: tuple[SearchStep, ...]


def cooldown_violation(loads: Sequence[float], backward: Sequence[float], master: int) -> int | None:
    """The first stage ``s > master`` breaking eq. (1), or ``None`` (``loads`` are ``f + b``)."""
    total = 0.0
    for s in range(master + 1, len(loads)):
        total += loads[s]
        if total > (s - master) * backward[master] * (1 + 1e-12):
            return s
    return None


def autopipe_search(
    evaluate: Callable[[Bounds], Measured],
    forward: Sequence[float],
    backward: Sequence[float],
    stages: int,
    *,
    feasible: FeasibleFn | None = None,
    max_simulations: int = 200,
) -> AutoPipeSearch:
    """Run the search of the module docstring on blocks with these forward/backward times."""
    compute = [f + b for f, b in zip(forward, backward)]
    start, _ = min_max_partition(compute, stages, feasible=feasible)
    search = _Heuristic(evaluate, compute, list(backward), feasible, max_simulations)
    start_result = search.simulate(start, "algorithm1")
    search.run(start)
    best, best_result = search.best(start_result)
    return AutoPipeSearch(bounds=best, result=best_result, start=start, start_result=start_result,
                          simulations=len(search.cache), trace=tuple(search.trace))


@dataclass
class _Heuristic:
    """The state of one :func:`autopipe_search`: the schemes simulated (memoised)."""

    evaluate: Callable[[Bounds], Measured]
    compute: list[float]
    """``f + b`` of every block."""
    backward: list[float]
    feasible: FeasibleFn | None
    max_simulations: int
    cache: dict[Bounds, Measured] = field(default_factory=dict)
    trace: list[SearchStep] = field(default_factory=list)

    def run(self, start: Bounds) -> None:
        """Steps 2 and 3 of the module docstring from ``start``, breadth first."""
        queue: deque[Bounds] = deque([start])
        processed: set[Bounds] = set()
        while queue and len(self.cache) < self.max_simulations:
            bounds = queue.popleft()
            if bounds in processed:
                continue
            processed.add(bounds)
            master = self.simulate(bounds, "queued").master_stage
            bounds = self.cooldown(bounds, master)
            master = self.simulate(bounds, "cooldown").master_stage
            if master == 0:
                continue
            for candidate in self.shifted(bounds, master):
                if candidate in self.cache or len(self.cache) >= self.max_simulations:
                    continue
                if self.simulate(candidate, "shift").master_stage <= master:
                    queue.append(candidate)

    def best(self, start_result: Measured) -> tuple[Bounds, Measured]:
        """The simulated-fastest scheme (equal up to rounding: the lighter heaviest stage)."""
        scale = start_result.iteration_time or 1.0

        def key(item: tuple[Bounds, Measured]) -> tuple[float, float]:
            bounds, result = item
            return (round(result.iteration_time / scale, 9),
                    max(stage_sums(self.compute, bounds)))

        return min(self.cache.items(), key=key)

    def simulate(self, bounds: Bounds, step: str) -> Measured:
        result = self.cache.get(bounds)
        if result is None:
            result = self.cache[bounds] = self.evaluate(bounds)
            self.trace.append(SearchStep(step, result.master_stage, result.iteration_time))
        return result

    def allowed(self, bounds: Bounds) -> bool:
        if self.feasible is None:
            return True
        return all(bool(self.feasible(s)[a, e]) for s, (a, e) in enumerate(bounds))

    def rebalance(self, bounds: Bounds, count: int) -> Bounds | None:
        """Algorithm 1 on the first ``count`` stages, over the blocks they hold."""
        end = bounds[count - 1][1]
        if count < 2 or end < count:
            return None
        head, _ = min_max_partition(self.compute, count, end=end)  # the prefix's own split
        return head + bounds[count:]

    def cooldown(self, bounds: Bounds, master: int) -> Bounds:
        """Step 2: push load towards the last stage until eq. (1) holds or the master moves."""
        while len(self.cache) < self.max_simulations:
            ends = list(bounds)
            loads = stage_sums(self.compute, bounds)
            stage_backward = stage_sums(self.backward, bounds)
            s = cooldown_violation(loads, stage_backward, master)
            if s is None or s == len(bounds) - 1 or ends[s][1] - ends[s][0] < 2:
                return bounds
            a, e = ends[s]
            ends[s], ends[s + 1] = (a, e - 1), (e - 1, ends[s + 1][1])
            moved = tuple(ends)
            if not self.allowed(moved):
                return bounds
            bounds = moved
            if self.simulate(bounds, "cooldown").master_stage != master:
                return bounds
        return bounds

    def shifted(self, bounds: Bounds, master: int) -> list[Bounds]:
        """Step 3: the schemes with the master stage's first/last block moved out."""
        out: list[Bounds] = []
        a, e = bounds[master]
        if e - a < 2:
            return out
        ends = list(bounds)
        first = ends[:]
        first[master - 1], first[master] = (first[master - 1][0], a + 1), (a + 1, e)
        out.append(tuple(first))
        rebalanced = self.rebalance(tuple(first), master)
        if rebalanced is not None:
            out.append(rebalanced)
        if master + 1 < len(bounds):
            last = ends[:]
            last[master], last[master + 1] = (a, e - 1), (e - 1, last[master + 1][1])
            out.append(tuple(last))
            rebalanced = self.rebalance(tuple(last), master + 1)
            if rebalanced is not None:
                out.append(rebalanced)
        return [b for b in out if self.allowed(b)]
