"""The tuner's simulated source (``pipeweave tune --source simulate``): a built-in model as a
:class:`~pipeweave.avgpipe.simulated.SimulatedModel` whose costs at micro-batch size ``b`` are
:func:`pipeweave.profiler.measure.profile_builtin` measured at ``b`` (one intra-op thread,
what a rank gets on this two-core machine), split uniformly into stages like ``pipeweave
train`` does; the profiler times also calibrate the utilisation levels
(:func:`~pipeweave.avgpipe.simulated.calibrate_levels`).

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..avgpipe.simulated import SimulatedModel
from ..planner.evaluate import Network
from ..planner.partition import uniform_partition
from ..profiler.profile import Profile

__all__ = ["LOOPBACK_BANDWIDTH", "builtin_model", "profile_cache"]

LOOPBACK_BANDWIDTH = 1.83e9
"""Bytes/s between two local ranks, from ``pipeweave profile``'s link measurement here."""


def profile_cache(model: str, *, repeats: int = 1, warmup: int = 1, rounds: int = 5,
                  threads: int = 1, seed: int = 0, cache: bool = True) -> Callable[[int], Profile]:
    """``micro-batch size -> profile_builtin(model)`` at that size; remembered when ``cache``.

    The model is profiled ``rounds`` times and every block keeps its fastest forward and
    backward: on a shared machine the minimum filters out the time other processes took (as
    latency benchmarks do; medians of a loaded two-core machine changed the shape of the cost
    curve from one run to the next).
    """
    from ..profiler.measure import profile_builtin

    remembered: dict[int, Profile] = {}

    def profile_at(size: int) -> Profile:
        if cache and size in remembered:
            return remembered[size]
        runs = [profile_builtin(model, batch_size=size, repeats=repeats, warmup=warmup,
                                threads=threads, seed=seed) for _ in range(rounds)]
        profile = replace(runs[0], blocks=tuple(
            replace(block, forward=min(r.blocks[i].forward for r in runs),
                    backward=min(r.blocks[i].backward for r in runs))
            for i, block in enumerate(runs[0].blocks)))
        if cache:
            remembered[size] = profile
        return profile

    return profile_at


def builtin_model(model: str, *, stages: int, batch_size: int, network: Network | None = None,
                  profile_at: Callable[[int], Profile] | None = None,
                  iterations: int = 2) -> SimulatedModel:
    """A built-in model split uniformly into ``stages``, simulated from measured costs."""
    profile_at = profile_at if profile_at is not None else profile_cache(model)
    bounds = uniform_partition(_num_blocks(model), stages)
    return SimulatedModel(profile_at=profile_at, bounds=bounds, batch_size=batch_size,
                          network=network if network is not None else Network(),
                          iterations=iterations)


def _num_blocks(model: str) -> int:
    from ..models import build_model

    return len(build_model(model).blocks)
