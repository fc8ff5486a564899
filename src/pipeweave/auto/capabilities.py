"""What a registered schedule accepts, asked of the schedule itself.

The search never lists which schedule supports what. It builds a tiny instance (two ranks,
the fewest micro-batches the schedule asks for) with the feature turned on and checks that
the schedule laid it out: a generator that refuses the shape raises ``ValueError``, and one
that would silently ignore it (a flush schedule handed ``pipelines=2`` lays out one pipeline)
is caught by comparing what it built with what it was asked. A newly registered schedule is
probed the same way, with no code here.
"""

from __future__ import annotations

from functools import lru_cache

from ..ir import Op
from ..schedules import Shape, build_schedule, get_info

__all__ = ["supports_pipelines", "supports_chunks", "supports_width", "supports_replicas",
           "accepts", "splits_backward"]


def accepts(schedule: str, shape: Shape) -> bool:
    """The schedule builds ``shape`` (options checked, M large enough, generator content)."""
    try:
        built = build_schedule(schedule, shape)
    except ValueError:  # a ScheduleError is one too
        return False
    return (built.pipelines == shape.pipelines
            and built.num_stages == shape.stages * shape.chunks
            and built.num_ranks == _ranks(shape))


def _ranks(shape: Shape) -> int:
    return sum(shape.replicas) if shape.replicas is not None else shape.stages * shape.width


def _probe(schedule: str, **fields: int | tuple[int, ...]) -> bool:
    info = get_info(schedule)
    shape = Shape(stages=2, microbatches=1, **fields)  # type: ignore[arg-type]
    try:
        needed = info.min_microbatches(shape)
    except ValueError:
        return False
    microbatches = max(needed, 4) * 2  # a multiple of the width and replica counts probed
    return accepts(schedule, Shape(stages=2, microbatches=microbatches, **fields))  # type: ignore[arg-type]


@lru_cache(maxsize=None)
def supports_pipelines(schedule: str) -> bool:
    """It lays out N > 1 parallel pipelines on the same ranks (AvgPipe)."""
    return _probe(schedule, pipelines=2)


@lru_cache(maxsize=None)
def supports_chunks(schedule: str, chunks: int) -> bool:
    """It places ``chunks`` model chunks on every rank."""
    return _probe(schedule, chunks=chunks)


@lru_cache(maxsize=None)
def supports_width(schedule: str) -> bool:
    """It runs data-parallel copies of the pipeline."""
    return _probe(schedule, width=2, chunks=get_info(schedule).default_chunks)


@lru_cache(maxsize=None)
def supports_replicas(schedule: str) -> bool:
    """It runs per-stage replicas (PipeDream's 1F1B-RR)."""
    return _probe(schedule, replicas=(1, 2))


@lru_cache(maxsize=None)
def splits_backward(schedule: str) -> bool:
    """Some of its backwards are split into I and W (zero-bubble schedules): the gradient a
    stage sends back may then be ready after the I alone, which the bounds must allow. Asked
    of tiny instances (two and four ranks, with the schedule's default chunks), unsplit
    everywhere there means a schedule that runs whole backwards."""
    info = get_info(schedule)
    for stages in (2, 4):
        shape = Shape(stages=stages, microbatches=1, chunks=info.default_chunks)
        try:
            microbatches = max(info.min_microbatches(shape), 2 * stages)
            built = build_schedule(schedule, Shape(stages=stages, microbatches=microbatches,
                                                   chunks=info.default_chunks))
        except ValueError:
            return True  # cannot tell: assume split (the weaker bound)
        if any(a[0] is Op.BACKWARD_INPUT for p in built.programs for a in p):
            return True
    return False
