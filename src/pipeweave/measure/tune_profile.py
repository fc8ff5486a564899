"""The tuner's one profile (avgpipe.txt §5.2.1), from either source: the setting ``(M, N)``
simulated from costs profiled here (:mod:`.tune_model`), or run for real (:mod:`.tune_runs`).

The utilisation ``φ`` of a computing rank (``utilisation``): ``work`` splits a rank's compute
time into per-sample work (level 1) and per-call overhead (level 0) from the profiler's times
at the profiled and the smallest-M (largest) micro-batch, ``intensity`` uses one calibrated
level, ``busy`` level 1 throughout (no profiler); docs/avgpipe.md.
"""

from __future__ import annotations

from collections.abc import Callable

from ..avgpipe import TuningProfile
from ..avgpipe.simulated import SimulatedModel, calibrate_levels, per_sample_seconds
from .tune_runs import RealRun, profile_real_run

__all__ = ["SOURCES", "UTILISATIONS", "tuning_profile", "tuning_sizes"]

SOURCES = ("simulate", "measure")
"""Where the tuner's numbers come from: the simulator fed with profiled costs, or real runs."""

UTILISATIONS = ("work", "intensity", "busy")
"""How a computing rank's utilisation is calibrated (module docstring)."""


def tuning_sizes(*, at: tuple[int, int], smallest_m: int, batch_size: int,
                 utilisation: str = "work") -> tuple[int, ...]:
    """The micro-batch sizes :func:`tuning_profile` reads profiles at: the profiled setting's
    (``batch_size / M``), and, to calibrate the utilisation (all but ``busy``), the smallest
    M's (the largest size) when it is another. Given to
    :func:`~pipeweave.measure.profile_cache` so that both are profiled together, interleaved."""
    m = at[0]
    if utilisation != "busy" and m != smallest_m:
        return (batch_size // m, batch_size // smallest_m)
    return (batch_size // m,)


def tuning_profile(model: SimulatedModel, *, at: tuple[int, int], smallest_m: int,
                   batch_size: int, source: str = "simulate", utilisation: str = "work",
                   run: Callable[[int, int], RealRun] | None = None) -> TuningProfile:
    """The profile of setting ``at = (M, N)`` of ``model`` (``batch_size`` samples per batch)
    from ``source``; ``run(M, N)`` runs a setting for real (``source="measure"``)."""
    if source not in SOURCES or utilisation not in UTILISATIONS:
        raise ValueError(f"source {source!r} / utilisation {utilisation!r}: give a source of "
                         f"{SOURCES} and a utilisation of {UTILISATIONS}")
    m, n = at
    levels, per_sample = None, None
    sizes = tuning_sizes(at=at, smallest_m=smallest_m, batch_size=batch_size,
                         utilisation=utilisation)
    if len(sizes) == 2:
        mine, reference = (model.profile_at(size) for size in sizes)
        if source == "measure" and utilisation == "work":
            per_sample = per_sample_seconds(mine, reference, model.bounds)
        else:
            levels = calibrate_levels(mine, reference, model.bounds, how=utilisation)
    if source == "simulate":
        return model.tuning_profile(m, n, levels=levels)
    if run is None:
        raise ValueError("source 'measure' runs the setting for real: give run(M, N)")
    return profile_real_run(run(m, n), network=model.network, levels=levels,
                            per_sample_s=per_sample)
