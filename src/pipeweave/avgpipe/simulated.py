"""The simulator as AvgPipe's measuring instrument: time and memory of one (M, N, advance).

A setting of a model is simulated from a per-block profile *measured at that setting's
micro-batch size* (``batch_size / M`` samples; the profile gives the compute times, the bytes
crossing each boundary and the activation bytes), a fixed split of the blocks into stages and
a link. Memory per rank is the memory model's (:mod:`pipeweave.memory`, asked through
:func:`pipeweave.planner.memory.predicted_memory`, as ``plan`` and ``auto`` ask it), split as
AvgPipe's Equation 8 needs it::

    fixed   = the reference model's weights (one copy, §3.2)
    F_mod   = N x (weights + optimizer state) + the gradients present at the peak
                                                            (the parallel models)
    F_dat   = the rest of the model's peak: activations of all N pipelines, messages in
              flight, the backward's workspace

This is what the tuner's simulated profile, the traversal's "measurement" and the advance
controller's tests all use. Pure Python (no torch) once the profiles exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..planner.evaluate import Network, plan_costs
from ..planner.memory import predicted_memory, stage_weights
from ..planner.partition import Bounds
from ..planner.plan import Plan
from ..profiler.profile import Profile
from ..schedules import build_schedule
from ..sim import Costs, SimulationResult, simulate
from .profile import BUSY, Levels, TuningProfile, profile_from_simulation
from .tuner import Measurement

__all__ = ["simulate_setting", "SimulatedModel", "advance_probe", "SimulatedTime",
           "calibrate_levels", "per_sample_seconds", "work_levels"]


def simulate_setting(stages: int, microbatches: int, costs: Costs, *, pipelines: int = 1,
                     advance: int | str = 0, iterations: int = 2) -> SimulationResult:
    """Simulate ``iterations`` iterations of ``avgpipe`` at ``(M, N, advance)`` with ``costs``."""
    schedule = build_schedule("avgpipe", stages=stages, microbatches=microbatches,
                              iterations=iterations, pipelines=pipelines, advance=advance)
    return simulate(schedule, costs)


def advance_probe(stages: int, microbatches: int, costs: Costs, *, pipelines: int = 1,
                  iterations: int = 2) -> Callable[[int], tuple[float, list[float]]]:
    """``advance -> (iteration time, peak activation bytes per rank)``, for driving an
    :class:`~pipeweave.avgpipe.controller.AdvanceController` with the simulator."""
    cache: dict[int, tuple[float, list[float]]] = {}

    def probe(advance: int) -> tuple[float, list[float]]:
        if advance not in cache:
            result = simulate_setting(stages, microbatches, costs, pipelines=pipelines,
                                      advance=advance, iterations=iterations)
            cache[advance] = (result.iteration_time, list(result.peak_activation_bytes))
        return cache[advance]

    return probe


@dataclass(frozen=True)
class SimulatedTime:
    """The runtime's online advance controller told the *simulated* iteration time.

    A ``time_source`` for :class:`pipeweave.runtime.advance.options.AdvanceOptions`: returns
    the simulated time of ``avgpipe`` at the advance a real iteration ran with, whatever that
    iteration measured. Real runs then make deterministic decisions (tests), e.g. with ``comm``
    standing for a slow link. ``scale`` converts the simulator's units to seconds.
    """

    stages: int
    microbatches: int
    costs: Costs
    pipelines: int = 1
    iterations: int = 2
    scale: float = 1.0
    _cache: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, advance: int, measured_s: float) -> float:
        if advance not in self._cache:
            result = simulate_setting(self.stages, self.microbatches, self.costs,
                                      pipelines=self.pipelines, advance=advance,
                                      iterations=self.iterations)
            self._cache[advance] = result.iteration_time * self.scale
        return self._cache[advance]


@dataclass
class SimulatedModel:
    """A model split into stages, simulated at any (M, N) from per-micro-batch-size profiles.

    Attributes:
        profile_at: micro-batch size -> the model's profile at that size (e.g. a call to
            :func:`pipeweave.profiler.profile_builtin`, cached or not).
        bounds: ``[start, end)`` blocks of every stage.
        batch_size: samples per batch (per pipeline); ``M`` must divide it.
        network: the link between consecutive ranks.
        iterations: iterations simulated per setting.
        optimizer: the optimizer trained with (a name of
            :data:`pipeweave.memory.OPTIMIZER_STATE`), for the optimizer state.
    """

    profile_at: Callable[[int], Profile]
    bounds: Bounds
    batch_size: int
    network: Network = field(default_factory=Network)
    iterations: int = 2
    optimizer: str = "adam"

    @property
    def stages(self) -> int:
        return len(self.bounds)

    def microbatch_size(self, microbatches: int) -> int:
        if self.batch_size % microbatches:
            raise ValueError(f"M={microbatches} does not divide the batch size {self.batch_size}; "
                             f"use a divisor of {self.batch_size}")
        return self.batch_size // microbatches

    def costs(self, profile: Profile) -> Costs:
        """The simulator's costs at ``profile``'s micro-batch size; a stage's activation is
        :meth:`stash_bytes` (the parameters are in ``F_mod``)."""
        return replace(plan_costs(profile, self.bounds, self.network),
                       activation_bytes=self.stash_bytes(profile))

    def stash_bytes(self, profile: Profile) -> list[float]:
        """What a stage keeps per micro-batch: the profile's ``stash_bytes``, i.e. what autograd
        saves without the block's own parameters. A Linear or convolution saves its weight
        for the backward; that storage *is* the parameter (counted in ``F_mod``), so counting
        it per held micro-batch would inflate ``F_dat`` by ``held x weights`` (and make it
        affine, not linear, in the micro-batch size)."""
        stash = profile.stash_bytes
        return [sum(stash[a:e]) for a, e in self.bounds]

    def plan(self, microbatches: int, pipelines: int, advance: int | str = 0) -> Plan:
        """The ``avgpipe`` plan of a setting (what the memory model is asked about)."""
        return Plan(num_blocks=self.bounds[-1][1], stages=tuple((a, e) for a, e in self.bounds),
                    schedule="avgpipe", microbatches=microbatches, pipelines=pipelines,
                    schedule_options={"advance": advance})

    def memory_parts(self, profile: Profile, microbatches: int, pipelines: int,
                     advance: int | str = 0) -> tuple[list[float], list[float], list[float]]:
        """Per rank, the memory model's peak of the setting (``profile`` at its micro-batch
        size) as Equation 8 splits it: ``(fixed, F_mod, F_dat)`` (module docstring), which
        add up to the model's total."""
        plan = self.plan(microbatches, pipelines, advance)
        ranks = predicted_memory(profile, plan, batch_size=self.batch_size,
                                 optimizer=self.optimizer)
        fixed = [w.parameters for w in stage_weights(profile, plan)]
        model = [r.parameters - f + r.gradients + r.optimizer_state for r, f in zip(ranks, fixed)]
        data = [r.total - m - f for r, m, f in zip(ranks, model, fixed)]
        return fixed, model, data

    def run(self, microbatches: int, pipelines: int, advance: int | str = 0
            ) -> tuple[Profile, SimulationResult]:
        profile = self.profile_at(self.microbatch_size(microbatches))
        result = simulate_setting(self.stages, microbatches, self.costs(profile),
                                  pipelines=pipelines, advance=advance, iterations=self.iterations)
        return profile, result

    def memory(self, profile: Profile, microbatches: int, pipelines: int,
               advance: int | str = 0) -> list[float]:
        """Per rank: the memory model's peak of the setting."""
        parts = self.memory_parts(profile, microbatches, pipelines, advance)
        return [sum(rank) for rank in zip(*parts)]

    def measure(self, microbatches: int, pipelines: int, advance: int | str = 0) -> Measurement:
        """One setting "measured" by simulation (a traversal's ``measure``)."""
        profile, result = self.run(microbatches, pipelines, advance)
        memory = self.memory(profile, microbatches, pipelines, advance)
        afab = simulate_setting(self.stages, microbatches, self.costs(profile),
                                pipelines=pipelines, advance="all", iterations=self.iterations)
        return Measurement(microbatches, pipelines, result.iteration_time, max(memory),
                           extra={"memory_per_rank": memory,
                                  "afab_iteration_s": afab.iteration_time,
                                  "bubble_fraction": result.bubble_fraction})

    def tuning_profile(self, microbatches: int, pipelines: int, *, advance: int | str = 0,
                       levels: Sequence[Levels] | None = None, bin_s: float | None = None,
                       notes: dict[str, Any] | None = None) -> TuningProfile:
        """The tuner's profile of one setting, from its simulated timeline (§5.2.1)."""
        profile, result = self.run(microbatches, pipelines, advance)
        fixed, model, data = self.memory_parts(profile, microbatches, pipelines, advance)
        return profile_from_simulation(
            result, model_bytes=model, fixed_bytes=fixed, data_bytes=data, levels=levels,
            bin_s=bin_s,
            batch_size=self.batch_size,
            notes={"model": profile.model, "microbatch_size": self.microbatch_size(microbatches),
                   **(notes or {})},
        )


def calibrate_levels(profile: Profile, reference: Profile, bounds: Bounds, *,
                     how: str = "work") -> list[Levels]:
    """Per stage, the utilisation while it computes a micro-batch of ``profile``'s size,
    calibrated against ``reference`` (another size) — the CPU's stand-in for a utilisation
    counter (see :mod:`pipeweave.avgpipe.profile`).

    ``how="work"``: a stage's time at ``b`` samples is ``α + β b`` through the two sizes; the
    per-sample part ``β b`` keeps the core busy (level 1), the fixed part ``α`` (Python,
    dispatch, latency of small kernels) does not (level 0). ``how="intensity"``: one level, the
    per-sample time at ``reference`` over that at ``profile`` (capped at 1).
    """
    if profile.batch_size is None or reference.batch_size is None:
        raise ValueError("calibrating the utilisation needs both profiles' batch_size")
    if how not in ("work", "intensity"):
        raise ValueError(f"how must be 'work' or 'intensity', got {how!r}")
    b, r = profile.batch_size, reference.batch_size
    out: list[Levels] = []
    for (a, e), per_sample in zip(bounds, per_sample_seconds(profile, reference, bounds)):
        mine = sum(x.compute for x in profile.blocks[a:e])
        theirs = sum(x.compute for x in reference.blocks[a:e])
        if mine <= 0 or b == r:
            out.append(BUSY)
        elif how == "intensity":
            out.append(((min(1.0, (theirs / r) / (mine / b)), 1.0),))
        else:
            out.append(work_levels(per_sample * b / mine))
    return out


def per_sample_seconds(profile: Profile, reference: Profile, bounds: Bounds) -> list[float]:
    """Per stage, the forward + backward seconds each sample adds: the slope ``β`` of a
    stage's time ``α + β b`` through the two profiles' micro-batch sizes (0 if they agree)."""
    if profile.batch_size is None or reference.batch_size is None:
        raise ValueError("calibrating the utilisation needs both profiles' batch_size")
    b, r = profile.batch_size, reference.batch_size
    out = []
    for a, e in bounds:
        mine = sum(x.compute for x in profile.blocks[a:e])
        theirs = sum(x.compute for x in reference.blocks[a:e])
        out.append(0.0 if b == r else max((theirs - mine) / (r - b), 0.0))
    return out


def work_levels(share: float) -> Levels:
    """A core doing per-sample work ``share`` of its busy time (level 1), overhead the rest
    (level 0: it would not grow with the micro-batch)."""
    work = min(1.0, max(share, 0.0))
    return ((1.0, work), (0.0, 1.0 - work))
