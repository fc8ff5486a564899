"""The search returns the simulator's optimum over the space, found here by brute force.

The oracle simulates every combination directly: its own stage costs from the profile (sums
of the blocks, scaled linearly to the micro-batch, recomputation adding a forward to the
backward of the first k stages, for every k), its own partitions (``planner.partition``),
``build_schedule`` and ``simulate``; it imports nothing of ``pipeweave.auto``. The profile has
no link, so transfers and all-reduces are free and the compute times are the whole cost.
"""

from __future__ import annotations

import math

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates, search
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.partition import min_max_partition, uniform_partition
from pipeweave.planner.plan import Plan
from pipeweave.profiler import Profile
from pipeweave.schedules import Shape, available_schedules, build_schedule, get_info
from pipeweave.sim import Costs, simulate

SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "sliced-1f1b", "zbv")
MICROBATCHES = (2, 4, 8)


def _bounds(profile: Profile, method: str, stages: int) -> tuple[tuple[int, int], ...]:
    if method == "uniform":
        return uniform_partition(profile.num_blocks, stages)
    return min_max_partition([b.forward + b.backward for b in profile.blocks], stages)[0]


def brute_force(profile: Profile, ranks: int, batch: int,
                memory_limit: float | None = None) -> float:
    """Best samples/s over every combination that builds (and fits the limit)."""
    assert profile.batch_size is not None
    best = 0.0
    for schedule in SCHEDULES:
        info = get_info(schedule)
        chunk_choices = (info.default_chunks, 2 * info.default_chunks) \
            if info.default_chunks > 1 else (1,)
        for depth in (d for d in range(1, ranks + 1) if ranks % d == 0):
            for chunks in chunk_choices:
                if depth * chunks > profile.num_blocks:
                    continue
                for m in (m for m in MICROBATCHES if batch % m == 0):
                    for method in ("uniform", "time"):
                        # every prefix: the first k stages recompute
                        for recompute in range(depth * chunks + 1):
                            rate = _one(profile, schedule, depth, ranks // depth, chunks, m,
                                        method, recompute, batch, memory_limit)
                            best = max(best, rate)
    return best


def _one(profile: Profile, schedule: str, depth: int, width: int, chunks: int, m: int,
         method: str, recompute: int, batch: int, memory_limit: float | None) -> float:
    assert profile.batch_size is not None
    bounds = _bounds(profile, method, depth * chunks)
    scale = batch / m / profile.batch_size
    fw = [scale * sum(b.forward for b in profile.blocks[a:e]) for a, e in bounds]
    bw = [scale * sum(b.backward for b in profile.blocks[a:e]) for a, e in bounds]
    up = [sum(b.update for b in profile.blocks[a:e]) for a, e in bounds]
    total_bw = [b + f if s < recompute else b for s, (b, f) in enumerate(zip(bw, fw))]
    options = {"costs": [fw, total_bw, 0.0]} if schedule == "sliced-1f1b" else {}
    shape = Shape(stages=depth, microbatches=m, chunks=chunks, width=width, options=options)
    try:
        built = build_schedule(schedule, shape)
    except ValueError:
        return 0.0
    if built.num_stages != depth * chunks:
        return 0.0
    result = simulate(built, Costs(forward=fw, backward=total_bw,
                                   weight_grad=[b / 2 for b in bw], update=up))
    if memory_limit is not None:
        plan = Plan(num_blocks=profile.num_blocks, stages=bounds, schedule=schedule,
                    microbatches=m, chunks=chunks, width=width,
                    recompute=tuple(s < recompute for s in range(len(bounds))),
                    schedule_options=options)
        peak = max(r.total for r in predicted_memory(profile, plan, batch_size=batch))
        if peak > memory_limit:
            return 0.0
    return batch / result.iteration_time


def _problem(profile: Profile, ranks: int, **extra: object) -> AutoProblem:
    return AutoProblem(profile=profile, ranks=ranks, schedules=SCHEDULES,
                       methods=("uniform", "time"), microbatches=MICROBATCHES, pipelines=(1,),
                       **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize("ranks,seed", [(2, 0), (2, 1), (4, 2), (4, 3)])
def test_search_finds_the_brute_force_optimum(ranks: int, seed: int) -> None:
    profile = small_profile(seed)
    problem = _problem(profile, ranks)
    result = search(problem)
    expected = brute_force(profile, ranks, problem.batch)
    assert result.winner.samples_per_second == pytest.approx(expected, rel=1e-9)
    assert result.pruned > 0, "the bounds should prune something even in a small space"
    assert result.considered == (result.invalid + result.pruned + result.simulated
                                 + result.duplicates)


@pytest.mark.parametrize("ranks,seed", [(2, 4), (4, 5)])
def test_search_under_a_memory_limit_finds_the_constrained_optimum(ranks: int, seed: int) -> None:
    profile = small_profile(seed)
    free = search(_problem(profile, ranks))
    peaks = sorted(p.max_memory for p in free.ranked)
    limit = peaks[len(peaks) // 3]  # a third of the unconstrained candidates fit
    # replicated stages only, as the brute force (sharded ones: tests/auto/test_auto_shard.py)
    problem = _problem(profile, ranks, memory_limit=limit, shard=("none",))
    result = search(problem)
    expected = brute_force(profile, ranks, problem.batch, memory_limit=limit)
    assert result.winner.samples_per_second == pytest.approx(expected, rel=1e-9)
    assert all(p.max_memory <= limit for p in result.ranked)
    assert result.winner.max_memory <= limit


def test_winner_is_never_predicted_slower_than_the_default() -> None:
    for seed in range(6):
        profile = small_profile(seed, blocks=8)
        for ranks in (2, 4):
            result = search(AutoProblem(profile=profile, ranks=ranks))
            assert result.default is not None
            assert result.winner.samples_per_second >= result.default.samples_per_second
            assert result.default.candidate.schedule == "1f1b"
            assert result.default.plan.stages == uniform_partition(8, ranks)


def test_a_limit_nothing_fits_is_one_clear_error() -> None:
    result = search(AutoProblem(profile=small_profile(0), ranks=2, memory_limit=1.0))
    assert not result.ranked
    with pytest.raises(ValueError, match="no candidate fits --memory-limit 1 bytes.*raise"):
        result.winner


def test_asynchronous_schedules_only_with_semantics_any() -> None:
    profile = small_profile(0)
    sync = search(AutoProblem(profile=profile, ranks=2, methods=("uniform",)))
    assert all(get_info(p.candidate.schedule).synchronous for p in sync.ranked)
    anything = search(AutoProblem(profile=profile, ranks=2, methods=("uniform",),
                                  semantics="any"))
    assert any(not get_info(p.candidate.schedule).synchronous for p in anything.ranked)
    assert anything.winner.samples_per_second >= sync.winner.samples_per_second


def test_parallel_pipelines_only_where_the_schedule_lays_them_out() -> None:
    problem = AutoProblem(profile=small_profile(1), ranks=2, pipelines=(1, 2), semantics="any")
    many = {c.schedule for c in enumerate_candidates(problem) if c.pipelines > 1}

    def lays_out_two(name: str) -> bool:
        try:
            return build_schedule(name, stages=2, microbatches=8, pipelines=2).pipelines == 2
        except ValueError:
            return False

    assert many == {info.name for info in available_schedules() if lays_out_two(info.name)}
    assert "avgpipe" in many


def test_predicted_memory_is_the_memory_models() -> None:
    profile = small_profile(2)
    problem = AutoProblem(profile=profile, ranks=2, methods=("uniform",))
    for p in search(problem).ranked[:5]:
        expected = [r.total for r in predicted_memory(profile, p.plan, batch_size=problem.batch)]
        assert list(p.peak_memory_bytes) == pytest.approx(expected)
        assert math.isfinite(p.iteration_time)
