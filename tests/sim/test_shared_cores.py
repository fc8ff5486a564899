"""Ranks sharing CPU cores: the processor-sharing walk against ``walk``, closed forms and a
hand-timed case.

* with a core per rank it is ``walk`` exactly, for every registered schedule;
* with one core and free communication the core never idles: the makespan is the sum of every
  compute cost;
* GPipe on 2 ranks and 1 core, timed by hand: two actions in progress at once each take twice
  their cost;
* it is never faster than a device per rank nor than ``work / cores``; lowering changes
  nothing; collectives, deadlocks and missing producers behave as in ``walk``;
* a waiting rank taking a share ``w`` of a core (``Costs.wait_share``): the GPipe case
  timed by hand again, ``12 + 4 w``; nothing changes with a core per rank; more share is
  never faster.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeweave.ir import CORE_OPS, ScheduleError, lower
from pipeweave.ir.walk import walk
from pipeweave.sim import Costs, simulate
from pipeweave.sim.shared_cores import walk_shared_cores
from pipeweave.sim.simulator import _delay_fn, _duration_fn

from test_simulator import build, hand_written, registered


def iterations_of(name: str) -> int:
    return 1 if name in ("gpipe", "1f1b", "interleaved-1f1b", "sliced-1f1b", "wpipe") else 3


@pytest.mark.parametrize("name", registered())
def test_a_core_per_rank_is_walk_exactly(name: str) -> None:
    schedule = build(name, 3, 6, iterations_of(name))
    rng = random.Random(name)
    stages = schedule.num_stages
    table = Costs(forward=[rng.uniform(0.5, 2) for _ in range(stages)],
                  backward=[rng.uniform(1, 3) for _ in range(stages)],
                  comm=[rng.uniform(0, 0.5) for _ in range(stages - 1)] or 0.0,
                  update=0.3).resolve(stages)
    duration, delay = _duration_fn(table), _delay_fn(table)
    dedicated = walk(schedule, duration, delay)
    shared = walk_shared_cores(schedule, duration, delay, cores=schedule.num_ranks)
    assert not shared.deadlocked
    for want, got in zip(dedicated.end, shared.end):
        assert got == pytest.approx(want, abs=1e-9)
    for want, got in zip(dedicated.start, shared.start):
        assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("name", registered())
def test_one_core_is_never_idle(name: str) -> None:
    schedule = build(name, 4, 8, iterations_of(name))
    costs = Costs(forward=1.0, backward=2.0, update=0.5, shared_cores=1)
    result = simulate(schedule, costs)
    assert result.makespan == pytest.approx(compute_work(schedule, costs), rel=1e-12)


def test_gpipe_on_two_ranks_and_one_core_timed_by_hand() -> None:
    result = simulate(build("gpipe", 2, 2), Costs(forward=1.0, backward=2.0, shared_cores=1))
    times = {text.split("@")[0]: (t0, t1) for _, text, t0, t1 in result.timeline}
    assert times["0F0"] == (0.0, 1.0)                       # alone on the core
    assert times["1F0"] == times["0F1"] == (1.0, 3.0)       # side by side: half speed each
    assert times["1F1"] == (3.0, 4.0)                       # rank 0 waits for a gradient
    assert times["1B0"] == (4.0, 6.0)
    assert times["0B0"] == times["1B1"] == (6.0, 10.0)
    assert times["0B1"] == (10.0, 12.0)
    assert result.makespan == 12.0                           # = all the work on one core
    # A core per rank: (M + P - 1)(F + B) = 9.
    assert simulate(build("gpipe", 2, 2), Costs(forward=1.0, backward=2.0, shared_cores=2)).makespan == 9.0


def test_a_waiting_rank_takes_its_share_of_the_core_timed_by_hand() -> None:
    """GPipe on 2 ranks and 1 core, a waiting rank taking w = 0.5 of it: an action computing
    beside a waiting rank runs at 1 / (1 + w), one beside a computing rank at 1 / 2 as
    before, one alone (the other rank through its program) at full speed. The actions
    computed beside a waiting rank (0F0, 1F1, 1B0: 4 units of work) take (1 + w) x 4 = 6,
    the rest as before: 12 + 4 w = 14."""
    costs = Costs(forward=1.0, backward=2.0, shared_cores=1, wait_share=0.5)
    result = simulate(build("gpipe", 2, 2), costs)
    times = {text.split("@")[0]: (t0, t1) for _, text, t0, t1 in result.timeline}
    assert times["0F0"] == pytest.approx((0.0, 1.5))               # rank 1 waits: 1 / 1.5
    assert times["1F0"] == times["0F1"] == pytest.approx((1.5, 3.5))  # side by side: 1 / 2
    assert times["1F1"] == pytest.approx((3.5, 5.0))               # rank 0 waits
    assert times["1B0"] == pytest.approx((5.0, 8.0))
    assert times["0B0"] == times["1B1"] == pytest.approx((8.0, 12.0))
    assert times["0B1"] == pytest.approx((12.0, 14.0))             # rank 1 is through
    assert result.makespan == pytest.approx(12.0 + 4 * 0.5)
    # with the default share, 0: the hand-timed case above
    assert simulate(build("gpipe", 2, 2), dataclasses.replace(costs, wait_share=0.0)
                    ).makespan == 12.0


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "pipedream", "avgpipe", "wpipe"])
def test_the_share_of_waiting_ranks_changes_nothing_with_a_core_per_rank(name: str) -> None:
    schedule = build(name, 3, 6, iterations_of(name))
    stages = schedule.num_stages
    costs = Costs(forward=[1.0 + 0.25 * (s % 3) for s in range(stages)], backward=2.0,
                  comm=0.3, update=0.2)
    alone = simulate(schedule, costs)
    for cores in (3, 4):
        shared = simulate(schedule, dataclasses.replace(costs, shared_cores=cores,
                                                        wait_share=0.9))
        assert shared.timeline == alone.timeline


def test_waiting_ranks_only_slow_the_computing_ones() -> None:
    """More share, never faster; 1F1B on 4 ranks and 2 cores slows with it."""
    schedule = build("1f1b", 4, 8)
    times = [simulate(schedule, Costs(forward=1.0, backward=2.0, comm=0.2, shared_cores=2,
                                      wait_share=w)).makespan for w in (0.0, 0.3, 0.6, 1.0)]
    assert times == sorted(times) and times[-1] > 1.1 * times[0]


def compute_work(schedule, costs: Costs) -> float:  # type: ignore[no-untyped-def]
    duration = _duration_fn(costs.resolve(schedule.num_stages))
    return sum(duration(rank, action) for rank, _, action in schedule.actions()
               if action.op in CORE_OPS)


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "pipedream", "avgpipe", "wpipe"])
@pytest.mark.parametrize("cores", [1, 2, 3])
def test_never_faster_than_a_device_per_rank_nor_than_work_over_cores(name: str, cores: int) -> None:
    schedule = build(name, 4, 8, iterations_of(name))
    rng = random.Random(cores)
    stages = schedule.num_stages
    dedicated = Costs(forward=[rng.uniform(0.5, 2) for _ in range(stages)],
                      backward=[rng.uniform(1, 3) for _ in range(stages)], comm=0.2)
    shared = dataclasses.replace(dedicated, shared_cores=cores)
    alone, together = simulate(schedule, dedicated), simulate(schedule, shared)
    assert together.makespan >= alone.makespan - 1e-9
    assert together.makespan >= compute_work(schedule, dedicated) / cores - 1e-9
    if cores <= schedule.num_ranks // 2:  # half the cores or fewer: sharing shows
        assert together.makespan > alone.makespan * 1.05


def test_lowering_changes_nothing() -> None:
    schedule = build("1f1b", 4, 8)
    costs = Costs(forward=[1.0, 1.5, 1.0, 0.5], backward=2.0, comm=0.3, shared_cores=2)
    plain, lowered = simulate(schedule, costs), simulate(lower(schedule), costs)
    assert lowered.iteration_time == pytest.approx(plain.iteration_time, abs=1e-9)
    compute = {text: (t0, t1) for _, text, t0, t1 in plain.timeline}
    for _, text, t0, t1 in lowered.timeline:
        if text in compute:
            assert (t0, t1) == pytest.approx(compute[text], abs=1e-9)


def test_replicas_all_reduce_together_and_use_no_core() -> None:
    schedule = build("1f1b", 2, 4, replicas=(2, 1))  # 3 ranks
    result = simulate(schedule, Costs(all_reduce=0.5, update=0.25, shared_cores=2))
    ar = [(t0, t1) for _, text, t0, t1 in result.timeline if "AR" in text]
    assert len(ar) == 2 and ar[0] == ar[1] and ar[0][1] - ar[0][0] == pytest.approx(0.5)
    assert ar[0][0] == max(t1 for r, text, _, t1 in result.timeline if r in (0, 1) and "B" in text)


def test_deadlocks_and_missing_producers_are_reported() -> None:
    costs = Costs(shared_cores=1)
    with pytest.raises(ScheduleError, match=r"deadlocks(.|\n)*>0B0<(.|\n)*>1F0<"):
        simulate(hand_written(["0B0 0F0", "1F0 1B0"], microbatches=1), costs)
    with pytest.raises(ScheduleError, match="1F1 depends on 0F1, which no rank schedules"):
        simulate(hand_written(["0F0 0B0", "1F0 1F1 1B0 1B1"], microbatches=2), costs)


def test_bad_core_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="shared_cores must be an integer >= 1"):
        Costs(shared_cores=0)
    with pytest.raises(ValueError, match="cores must be an integer >= 1, got 0"):
        walk_shared_cores(build("1f1b", 2, 2), lambda r, a: 1.0, cores=0)
    for bad in (-0.5, float("inf"), True):
        with pytest.raises(ValueError, match="waiting must be a finite number >= 0"):
            walk_shared_cores(build("1f1b", 2, 2), lambda r, a: 1.0, cores=1, waiting=bad)
        with pytest.raises(ValueError, match="wait_share"):
            Costs(shared_cores=1, wait_share=bad)
    # one checker (sim.costs.check_number), each message naming its own argument
    with pytest.raises(ValueError, match=r"waiting must be a finite number >= 0 \(the share of "
                                         r"a core a waiting rank takes\), got 'x'"):
        walk_shared_cores(build("1f1b", 2, 2), lambda r, a: 1.0, cores=1, waiting="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait_share must be a finite number >= 0, got 'x'"):
        Costs(shared_cores=1, wait_share="x")  # type: ignore[arg-type]
