"""Check a schedule's declared capabilities against what its generator builds.

A :class:`~pipeweave.schedules.registry.ScheduleInfo` says what the schedule supports
(pipelines, width, replicas, chunks, split backward), and everything else in pipeweave reads
those fields, never the name. :func:`mismatches` asks the generator itself: it builds a tiny
instance (two ranks, the fewest micro-batches the schedule asks for) with the feature turned
on and checks that the schedule laid it out. A generator that refuses the shape raises
``ValueError``, and one that would silently ignore it (a flush schedule handed
``pipelines=2`` lays out one pipeline) is caught by comparing what it built with what it was
asked. ``tests/schedules/test_declared.py`` runs it on every registered schedule; whoever
registers a new one can run it too.
"""

from __future__ import annotations

from ..ir import Op
from .registry import Shape, build_schedule, get_info

__all__ = ["accepts", "mismatches", "PROBED_CHUNKS"]

PROBED_CHUNKS = (1, 2, 3, 4)
"""Chunk counts :func:`mismatches` tries (``chunks=None`` declares all of them)."""


def accepts(schedule: str, shape: Shape) -> bool:
    """The schedule builds ``shape`` (options checked, M large enough, generator content)."""
    try:
        built = build_schedule(schedule, shape)
    except ValueError:  # a ScheduleError is one too
        return False
    ranks = sum(shape.replicas) if shape.replicas is not None else shape.stages * shape.width
    return (built.pipelines == shape.pipelines
            and built.num_stages == shape.stages * shape.chunks
            and built.num_ranks == ranks)


def _probe(schedule: str, **fields: int | tuple[int, ...]) -> bool:
    info = get_info(schedule)
    shape = Shape(stages=2, microbatches=1, **fields)  # type: ignore[arg-type]
    try:
        needed = info.min_microbatches(shape)
    except ValueError:
        return False
    microbatches = max(needed, 4) * 2  # a multiple of the width and replica counts probed
    return accepts(schedule, Shape(stages=2, microbatches=microbatches, **fields))  # type: ignore[arg-type]


def _splits(schedule: str) -> bool:
    """Some backward of a tiny instance (two and four ranks, default chunks) is split."""
    info = get_info(schedule)
    for stages in (2, 4):
        shape = Shape(stages=stages, microbatches=1, chunks=info.default_chunks)
        microbatches = max(info.min_microbatches(shape), 2 * stages)
        built = build_schedule(schedule, Shape(stages=stages, microbatches=microbatches,
                                               chunks=info.default_chunks))
        if any(a[0] is Op.BACKWARD_INPUT for p in built.programs for a in p):
            return True
    return False


def mismatches(schedule: str) -> list[str]:
    """Each declared capability of ``schedule`` its generator contradicts, in words (empty:
    the entry tells the truth)."""
    info = get_info(schedule)
    found = {
        "pipelines": _probe(schedule, pipelines=2),
        "width": _probe(schedule, width=2, chunks=info.default_chunks),
        "replicas": _probe(schedule, replicas=(1, 2)),
        "split_backward": _splits(schedule),
    }
    wrong = [f"{schedule}: declares {name}={getattr(info, name)} but builds as {value}"
             for name, value in found.items() if getattr(info, name) != value]
    built = tuple(c for c in PROBED_CHUNKS if _probe(schedule, chunks=c))
    declared = tuple(c for c in PROBED_CHUNKS if info.takes_chunks(c))
    if built != declared:
        wrong.append(f"{schedule}: declares chunks={info.chunks} but builds chunks {built} "
                     f"of {PROBED_CHUNKS}")
    return wrong
