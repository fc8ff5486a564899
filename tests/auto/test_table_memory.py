"""The search asks the memory model of the table's candidates whose shape it still holds
first (``search._cached_first``): the same predictions, ranked and over the limit in the same
order, as asking them one after another, and no more shapes analysed."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.predict import Prediction, Timed
from pipeweave.planner import memory_shape
from pipeweave.planner.memory_shape import clear_shape_cache

search_module = importlib.import_module("pipeweave.auto.search")


def _in_order(state: object, chosen: Sequence[Timed]) -> list[Prediction]:
    return [state.memory(t) for t in chosen]  # type: ignore[attr-defined]


def _run(problem: AutoProblem, monkeypatch: pytest.MonkeyPatch) -> tuple[object, int]:
    analysed = []
    real = memory_shape.analyse_shape
    monkeypatch.setattr(memory_shape, "analyse_shape",
                        lambda name, shape: analysed.append(1) or real(name, shape))
    clear_shape_cache()
    result = search(problem)
    monkeypatch.setattr(memory_shape, "analyse_shape", real)
    return result, len(analysed)


@pytest.mark.parametrize("seed,cache", [(0, 1), (1, 2), (2, 3)])
def test_cached_first_gives_the_same_table(seed: int, cache: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_shape, "CACHE_SIZE", cache)  # few shapes held: order matters
    problem = AutoProblem(profile=small_profile(seed), ranks=4,
                          schedules=("1f1b", "gpipe", "zb-h1", "interleaved-1f1b"),
                          methods=("uniform", "time"), microbatches=(4, 8), pipelines=(1,))
    free, _ = _run(problem, monkeypatch)
    peaks = sorted(p.max_memory for p in free.ranked)
    limited = AutoProblem(profile=problem.profile, ranks=4, schedules=problem.schedules,
                          methods=problem.methods, microbatches=problem.microbatches,
                          pipelines=(1,), memory_limit=peaks[len(peaks) // 2])
    fast, fast_analysed = _run(limited, monkeypatch)
    monkeypatch.setattr(search_module, "_cached_first", _in_order)
    slow, slow_analysed = _run(limited, monkeypatch)
    assert fast.ranked == slow.ranked and fast.over_limit == slow.over_limit
    assert len(fast.ranked) + len(fast.over_limit) > 3
    assert fast_analysed <= slow_analysed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_table_rows_ask_the_memory_model_only_what_the_table_needs(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_rows`` (``auto --top``): the table's first rows are those asking every
    runner-up gives, with fewer memory predictions; some of those rows were runners-up, so
    stopping one too early would change them."""
    asked: list[int] = []
    real = search_module._Search.memory
    monkeypatch.setattr(search_module._Search, "memory",
                        lambda self, timed: asked.append(1) or real(self, timed))
    base = dict(profile=small_profile(seed), ranks=8)  # every axis: runners-up (4-12)
    peaks = sorted(p.max_memory for p in search(AutoProblem(**base)).ranked)  # type: ignore[arg-type]
    limit = peaks[len(peaks) // 2]
    asked.clear()
    full = search(AutoProblem(**base, memory_limit=limit))  # type: ignore[arg-type]
    everything = len(asked)
    for rows in (1, 2, 3):
        asked.clear()
        lazy = search(AutoProblem(**base, memory_limit=limit,  # type: ignore[arg-type]
                                  table_rows=rows))
        assert lazy.ranked[:rows] == full.ranked[:rows]
        assert len(asked) < everything
    assert len(full.ranked) > 3


@pytest.mark.parametrize("rows", [0, -1, True, 2.0])
def test_table_rows_that_are_not_a_count_are_refused(rows: object) -> None:
    with pytest.raises(ValueError, match="table_rows"):
        AutoProblem(profile=small_profile(0), ranks=4, table_rows=rows)  # type: ignore[arg-type]
