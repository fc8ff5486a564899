"""The tuner's simulated source (``pipeweave tune --source simulate``): a built-in model as a
:class:`~pipeweave.avgpipe.simulated.SimulatedModel` whose costs at micro-batch size ``b`` are
:func:`pipeweave.profiler.measure.profile_builtin` measured at ``b`` (one intra-op thread,
what a rank gets on this two-core machine; the sizes the tuner reads profiled together,
interleaved, :func:`profile_cache`), split uniformly into stages like ``pipeweave
train`` does; the profiler times also calibrate the utilisation levels
(:func:`~pipeweave.avgpipe.simulated.calibrate_levels`).

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..avgpipe.simulated import SimulatedModel
from ..planner.evaluate import Network
from ..planner.partition import uniform_partition
from ..profiler.profile import Profile

__all__ = ["LOOPBACK_BANDWIDTH", "builtin_model", "profile_cache"]

LOOPBACK_BANDWIDTH = 1.83e9
"""Bytes/s between two local ranks, from ``pipeweave profile``'s link measurement here."""


def profile_cache(model: str, *, sizes: Sequence[int] = (), repeats: int = 1, warmup: int = 1,
                  rounds: int = 5, threads: int = 1, seed: int = 0,
                  cache: bool = True) -> Callable[[int], Profile]:
    """``micro-batch size -> profile_builtin(model)`` at that size; remembered when ``cache``
    (each size profiled once).

    The first size asked is profiled together with every size of ``sizes`` not profiled yet
    (the sizes the caller will ask, e.g. :func:`~pipeweave.measure.tuning_sizes`), their
    timed runs interleaved (:func:`~pipeweave.profiler.measure.profile_builtin_sizes`: one
    run of every size a round), so a load that comes or goes while profiling slows every
    size alike and their ratio (the tuner's per-sample work) stays the machine's. Without
    ``cache``, each call profiles the size asked alone, afresh (a traversal's cost).

    The sizes are profiled ``rounds`` times and every block keeps its fastest forward and
    backward: on a shared machine the minimum filters out the time other processes took (as
    latency benchmarks do; medians of a loaded two-core machine changed the shape of the cost
    curve from one run to the next).
    """
    remembered: dict[int, Profile] = {}

    def profiled(wanted: Sequence[int]) -> dict[int, Profile]:
        return _fastest_of_rounds(model, wanted, rounds=rounds, repeats=repeats, warmup=warmup,
                                  threads=threads, seed=seed)

    def profile_at(size: int) -> Profile:
        if not cache:
            return profiled([size])[size]
        if size not in remembered:
            remembered.update(profiled([s for s in dict.fromkeys([size, *sizes])
                                        if s not in remembered]))
        return remembered[size]

    return profile_at


def _fastest_of_rounds(model: str, sizes: Sequence[int], *, rounds: int, repeats: int,
                       warmup: int, threads: int, seed: int) -> dict[int, Profile]:
    """``sizes`` profiled interleaved ``rounds`` times, each block's fastest forward and
    backward of the rounds kept, per size."""
    from ..profiler.measure import profile_builtin_sizes

    runs = [profile_builtin_sizes(model, batch_sizes=sizes, repeats=repeats, warmup=warmup,
                                  threads=threads, seed=seed) for _ in range(rounds)]
    return {size: replace(runs[0][k], blocks=tuple(
        replace(block, forward=min(r[k].blocks[i].forward for r in runs),
                backward=min(r[k].blocks[i].backward for r in runs))
        for i, block in enumerate(runs[0][k].blocks)))
        for k, size in enumerate(sizes)}


def builtin_model(model: str, *, stages: int, batch_size: int, network: Network | None = None,
                  profile_at: Callable[[int], Profile] | None = None, sizes: Sequence[int] = (),
                  iterations: int = 2) -> SimulatedModel:
    """A built-in model split uniformly into ``stages``, simulated from measured costs
    (``profile_at``, by default :func:`profile_cache` of ``sizes``, the micro-batch sizes that
    will be asked, profiled interleaved on first use)."""
    profile_at = profile_at if profile_at is not None else profile_cache(model, sizes=sizes)
    bounds = uniform_partition(_num_blocks(model), stages)
    return SimulatedModel(profile_at=profile_at, bounds=bounds, batch_size=batch_size,
                          network=network if network is not None else Network(),
                          iterations=iterations)


def _num_blocks(model: str) -> int:
    from ..models import build_model

    return len(build_model(model).blocks)
