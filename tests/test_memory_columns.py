"""The memory model read off a flush schedule's columns (``memory/lowered_columns.py``,
``memory/walk_columns.py``, ``planner/memory_shape.py``'s ``_from_columns``) gives exactly
(``==``) what the lowered actions give (``memory.timeline``): every registered schedule the
columns cover, on a grid of stages x chunks x micro-batches, with random bytes per stage,
recomputation, split backwards and workspace; and the holds and steps themselves agree. A
model off by one micro-batch gives other numbers, which the last test checks the grid sees."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

from pipeweave.memory.timeline import analyse_programs
from pipeweave.planner import Plan
from pipeweave.planner import memory_shape
from pipeweave.planner.memory import predicted_memory
from pipeweave.schedules import Shape, available_schedules, get_info, lowered_schedule

from schedule_grid import random_memory_profile

SCHEDULES = [info.name for info in available_schedules() if info.synchronous]


def _plans(name: str) -> Iterator[Plan]:
    """Plans of ``name`` on 1-8 ranks, its chunks, several micro-batch counts, a random
    split each, with and without recomputing every other stage."""
    info = get_info(name)
    chunks = sorted({info.default_chunks, 2} if info.default_chunks > 1 else {1})
    for ranks in (1, 2, 3, 5, 8):
        for v in chunks:
            for M in (ranks, 2 * ranks, 3 * ranks + 1, 4 * ranks)[:3 if ranks == 8 else 4]:
                stages = ranks * v
                blocks = 2 * stages + 1
                rng = random.Random(f"{name}{ranks}{v}{M}")
                cuts = sorted(rng.sample(range(1, blocks), stages - 1))
                edges = [0, *cuts, blocks]
                for recompute in ((), tuple(s % 2 == 0 for s in range(stages))):
                    yield Plan(num_blocks=blocks, stages=tuple(zip(edges, edges[1:])),
                               schedule=name, microbatches=M, chunks=v, recompute=recompute)


def _predict(plan: Plan, columns: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(memory_shape, "COLUMNS", columns)
    memory_shape.clear_shape_cache()
    profile = random_memory_profile(plan.microbatches * 7 + len(plan.stages), plan.num_blocks)
    try:
        return predicted_memory(profile, plan, batch_size=2 * plan.microbatches)
    except ValueError as error:  # a shape the schedule refuses: refused alike
        return str(error)


@pytest.mark.parametrize("name", SCHEDULES)
def test_columns_give_the_actions_numbers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    served = 0
    for plan in _plans(name):
        fresh = _predict(plan, False, monkeypatch)
        got = _predict(plan, True, monkeypatch)
        assert got == fresh, (name, plan.depth, plan.chunks, plan.microbatches, plan.recompute)
        analysis = memory_shape.shape_analysis(name, plan.shape(1)) \
            if not isinstance(got, str) else None
        served += analysis is not None and analysis.columns is not None
    assert served > 0, name  # every synchronous schedule is laid out as columns


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb", "zb-h1", "v-half",
                                  "sliced-1f1b", "1f1b"])
def test_holds_and_steps_are_the_actions(name: str) -> None:
    """The columns' messages in flight and steps, position for position, against
    :func:`~pipeweave.memory.timeline.analyse_programs` of the lowered actions."""
    info = get_info(name)
    v = 2 if info.default_chunks > 1 else 1
    shape = Shape(stages=4, microbatches=8, chunks=v)
    memory_shape.clear_shape_cache()
    analysis = memory_shape._from_columns(name, shape)
    assert analysis is not None and analysis.columns is not None
    t, _ = analysis.columns
    reference = analyse_programs(lowered_schedule(name, shape))
    offsets = np.concatenate([[0], np.cumsum(t.lengths + 1)])
    first, stop, stage, sized = t.holds
    owner = np.searchsorted(offsets, first, side="right") - 1
    for rank, timeline in enumerate(reference):
        assert t.lengths[rank] == timeline.length
        mine = owner == rank
        holds = tuple(zip((first[mine] - offsets[rank]).tolist(),
                          (stop[mine] - offsets[rank]).tolist(),
                          stage[mine].tolist(), sized[mine].tolist()))
        assert holds == timeline.holds, (name, rank)
        a, b = t.step_cut[rank], t.step_cut[rank + 1]
        assert (t.position[a:b] - offsets[rank]).tolist() == [p for p, _ in timeline.steps]
        assert t.microbatch[a:b].tolist() == [-1 if x[2] is None else x[2]
                                             for _, x in timeline.steps]


def test_the_grid_sees_a_model_off_by_one_microbatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns laid out for one micro-batch fewer, or a micro-batch's activations released
    one action late, change the columns' prediction on the grid: the comparison above
    would fail for either."""
    from dataclasses import replace

    from pipeweave.memory import walk_columns

    real_arrays, real_before = memory_shape.flush_arrays, walk_columns._before

    def fewer(name: str, shape: Shape) -> object:
        return real_arrays(name, replace(shape, microbatches=max(1, shape.microbatches - 1)))

    def late(values: np.ndarray, cut: np.ndarray) -> np.ndarray:
        return real_before(real_before(values, cut), cut)

    for name, (where, attribute, wrong) in [
            ("1f1b", (memory_shape, "flush_arrays", fewer)),
            ("interleaved-1f1b", (memory_shape, "flush_arrays", fewer)),
            ("zb-h1", (walk_columns, "_before", late))]:
        changed = 0
        for plan in _plans(name):
            fresh = _predict(plan, False, monkeypatch)
            real = getattr(where, attribute)
            monkeypatch.setattr(where, attribute, wrong)
            changed += _predict(plan, True, monkeypatch) != fresh
            monkeypatch.setattr(where, attribute, real)
        assert changed > 0, name


@pytest.mark.parametrize("ranks,microbatches", [(2, 3), (3, 6), (4, 9)])
def test_every_slicer_count(ranks: int, microbatches: int,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Sliced 1F1B with each count of halved micro-batches (the search's ``sliced=k``): the
    halves hold half each, in the columns as in the actions."""
    blocks = 2 * ranks + 1
    for count in range(microbatches + 1):
        cuts = sorted(random.Random(count).sample(range(1, blocks), ranks - 1))
        edges = [0, *cuts, blocks]
        plan = Plan(num_blocks=blocks, stages=tuple(zip(edges, edges[1:])),
                    schedule="sliced-1f1b", microbatches=microbatches,
                    schedule_options={"sliced": count})
        fresh = _predict(plan, False, monkeypatch)
        assert _predict(plan, True, monkeypatch) == fresh, count
        assert memory_shape.shape_analysis("sliced-1f1b", plan.shape(1)).columns is not None
