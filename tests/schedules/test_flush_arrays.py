"""The programs laid out as numpy columns (schedules/flush_arrays.py) are the registered
generators' programs, action for action, on many shapes, with and without copy 0's
all-reduce before each update; their held-activation peaks are the memory model's counts;
and every shape they do not cover is left to the generator (None)."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeweave.auto.copies import _reduced_before_steps
from pipeweave.ir import Action
from pipeweave.memory.held_counts import held_peak_bytes
from pipeweave.schedules import Shape, available_schedules, build_schedule
from pipeweave.schedules.flush_arrays import flush_arrays

COVERED = ("gpipe", "1f1b", "interleaved-1f1b", "gpipe-grouped", "zb-h1", "zb-h2",
           "interleaved-zb", "zbv", "v-half", "v-min", "dualpipev", "avgpipe",
           "sliced-1f1b")
GRID = list(itertools.product((1, 2, 3, 5), (1, 2, 3, 4), (1, 2, 5, 6, 10, 12, 20), (1, 2)))


def _reference(name: str, shape: Shape, reduce: bool) -> tuple[tuple[Action, ...], ...]:
    programs = build_schedule(name, shape).programs
    return tuple(_reduced_before_steps(p) for p in programs) if reduce else programs


@pytest.mark.parametrize("name", COVERED)
@pytest.mark.parametrize("reduce", [False, True])
def test_columns_are_the_generators_programs(name: str, reduce: bool) -> None:
    compared = 0
    for stages, chunks, microbatches, iterations in GRID:
        shape = Shape(stages=stages, microbatches=microbatches, chunks=chunks,
                      iterations=iterations)
        columns = flush_arrays(name, shape, reduce_before_step=reduce)
        if columns is None:  # not covered: chunks on GPipe/1F1B, or M not a multiple of P
            assert chunks > 1
            continue
        assert columns.programs() == _reference(name, shape, reduce), shape
        compared += 1
    assert compared >= 48


@pytest.mark.parametrize("name", COVERED)
def test_held_peaks_are_the_memory_models(name: str) -> None:
    rng = random.Random(3)
    for stages, chunks, microbatches, _ in GRID:
        shape = Shape(stages=stages, microbatches=microbatches, chunks=chunks)
        columns = flush_arrays(name, shape, reduce_before_step=True)
        if columns is None:
            continue
        sizes = [rng.uniform(1.0, 9.0) for _ in range(stages * chunks)]
        reference = build_schedule(name, shape)
        assert columns.held_peak_bytes(sizes) == held_peak_bytes(reference, sizes), shape


def test_uncovered_shapes_go_to_the_generator() -> None:
    assert flush_arrays("1f1b", Shape(stages=2, microbatches=4, width=2)) is None
    assert flush_arrays("1f1b", Shape(stages=2, microbatches=4, replicas=(1, 2))) is None
    assert flush_arrays("1f1b", Shape(stages=2, microbatches=4, options={"sliced": 1})) is None
    assert flush_arrays("interleaved-1f1b", Shape(stages=2, microbatches=3, chunks=2)) is None
    assert flush_arrays("gpipe", Shape(stages=2, microbatches=4, chunks=2)) is None
    assert flush_arrays("avgpipe", Shape(stages=2, microbatches=4, pipelines=2)) is None
    assert flush_arrays("avgpipe", Shape(stages=2, microbatches=4, options={"advance": 1})) is None
    others = [i.name for i in available_schedules() if i.name not in COVERED]
    assert others and all(flush_arrays(n, Shape(stages=2, microbatches=4)) is None
                          for n in others)
