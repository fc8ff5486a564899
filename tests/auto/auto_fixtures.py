"""Small synthetic profiles for the auto tests (no link: transfers and all-reduces are free,
so a hand-written oracle needs only the compute times), the walk over a search space's
completed candidates that the memory-floor tests share, and a calibration runner that
replays synthetic rounds."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence

from pipeweave.auto import AutoProblem, enumerate_candidates
from pipeweave.auto.axes import Candidate
from pipeweave.auto.predict import one_copy_suffices
from pipeweave.auto.search import _Search, _valid_shape
from pipeweave.auto.timing import plan_schedule
from pipeweave.ir import Schedule
from pipeweave.planner import Plan
from pipeweave.profiler import BlockProfile, LinkProfile, Profile
from pipeweave.schedules import get_info


def small_profile(seed: int, blocks: int = 6, *, batch_size: int = 2,
                  link: LinkProfile | None = None) -> Profile:
    """Blocks with random forward/backward times (ms) and sizes (MB), one micro-batch of
    ``batch_size`` samples."""
    rng = random.Random(seed)
    return Profile(tuple(
        BlockProfile(f"b{i}", forward=rng.uniform(1e-3, 4e-3), backward=rng.uniform(2e-3, 8e-3),
                     output_bytes=rng.uniform(0.1, 1) * 1e6,
                     activation_bytes=rng.uniform(0.5, 4) * 1e6,
                     parameter_bytes=rng.uniform(0.1, 3) * 1e6,
                     optimizer_bytes=0.0, update=rng.uniform(0, 5e-4))
        for i in range(blocks)
    ), model="toy", batch_size=batch_size, device="synthetic", source="synthetic", link=link)


def completions(problem: AutoProblem, *, synchronous_only: bool = False
                ) -> Iterator[tuple[Candidate, Candidate, Plan, Profile]]:
    """Every candidate of ``problem`` of a valid shape (of a synchronous schedule, if asked)
    that the search completes (partitions and builds), as the search does: ``(candidate,
    completed candidate, plan, the profile at its micro-batch)``. Those it cannot complete
    (``ValueError``) are left out."""
    state = _Search(problem, lambda _text: None)
    for candidate in enumerate_candidates(problem):
        if not _valid_shape(candidate, problem):
            continue
        if synchronous_only and not get_info(candidate.schedule).synchronous:
            continue
        try:
            done, plan, profile = state.complete(candidate)
        except ValueError:
            continue
        yield candidate, done, plan, profile


def completed_candidates(problem: AutoProblem, *, synchronous_only: bool = False
                         ) -> Iterator[tuple[Candidate, Plan, Schedule, bool]]:
    """:func:`completions` with the schedule each runs: ``(candidate, plan, one-iteration
    schedule, one_copy)``. Those the schedule refuses (``ValueError``) are left out, as the
    search counts them invalid."""
    for candidate, _, plan, _ in completions(problem, synchronous_only=synchronous_only):
        try:
            one_copy = one_copy_suffices(plan, problem)
            schedule = plan_schedule(plan, 1, one_copy=one_copy)
        except ValueError:
            continue
        yield candidate, plan, schedule, one_copy


def replayed(times: Mapping[str, Sequence[float]], compute: Mapping[str, Sequence[float]],
             ranks: int) -> Callable[[str, Plan, int], tuple[float, list[float]]]:
    """A calibration runner (``fit_calibration``'s ``time_one``) that gives each plan's
    rounds in order: its iteration ``times[label][r]`` and its compute ``compute[label][r]``
    spread evenly over ``ranks``."""
    calls: dict[str, int] = {}

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        index = calls[label] = calls.get(label, -1) + 1
        return times[label][index], [compute[label][index] / ranks] * ranks

    return time_one
