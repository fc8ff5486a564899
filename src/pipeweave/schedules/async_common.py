"""The order shared by the asynchronous schedules: 1F1B(-RR) without flush, updates, version counts.

PipeDream, PipeDream-2BW, PipeOptim and SpecTrain run the same per-rank order (pipedream.txt
§3.2): admit a few micro-batches, then alternate one backward and one forward, with no flush
between iterations (micro-batch indices run on across iterations). They differ only in when an
update ``U`` lands (after every backward, or every ``M``-th) and in which weight version each
forward and backward is tagged with. This module lays out the order and the updates and counts,
for every micro-batch on every stage, how many updates its replica had made before its forward
and before its backward; each schedule turns those counts into version tags with a small rule.

Straight pipeline, P=3 (stage ``s`` admits ``P - s`` micro-batches, then alternates B/F)::

    rank0  F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 ...
    rank1     F0 F1 B0 F2 B1 F3 B2 F4 B3 ...
    rank2        F0 B0 F1 B1 F2 B2 F3 B3 ...

Replicated stages (1F1B-RR, pipedream.txt §3.2): micro-batch ``j`` runs on replica ``j % r_s``
of stage ``s`` for forward and backward; each replica runs the order above over its own
micro-batches with warm-up depth (:func:`warmup_depth`)::

    depth(s) = ceil((r_s + r_{s+1} + ... + r_{S-1}) / r_s)

In steady state every worker at or after stage ``s`` holds one micro-batch that stage ``s``
has admitted and not yet seen back, and stage ``s``'s replicas share those round-robin. For the
input stage this is the paper's NOAM = ceil(#workers / #input-stage replicas); for a straight
pipeline it is ``P - s``.

Replicas of a stage synchronise per *round*: round ``q`` of stage ``s`` is micro-batches
``q*r_s .. q*r_s + r_s - 1``, one per replica, and each replica's ``q``-th backward belongs to
round ``q``. An update period of ``n`` rounds puts ``AR`` (all-reduce among the replicas) and
``U`` after every ``n``-th backward of each replica, so all replicas issue the same all-reduces
in the same order. This needs ``M`` divisible by every ``r_s`` (every iteration is whole rounds).

**Drain** (option ``drain=N``, :func:`drain_segments`): after every ``N``-th iteration every
stage finishes its in-flight micro-batches and lands their updates before the next iteration's
first forward, as at the end of the run; the next ``N`` iterations start with a fresh warm-up
on the weights reached there. P=2, M=2, K=2, ``drain=1``, PipeDream::

    rank0  F0@0 F1@0 B0@0 U@1 B1@0 U@2 | F2@2 F3@2 B2@2 U@3 B3@2 U@4
    rank1       F0@0 B0@0 U@1 F1@1 B1@1 U@2 | F2@2 B2@2 U@3 F3@3 B3@3 U@4

The ``|`` is a point where nothing is in flight and every stage holds one weight version:
checkpoints go there (``pipeweave train --checkpoint-every N`` drains every ``N`` steps; see
docs/semantics.md for the staleness it removes and its cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..ir import Action, Layout, Op, Schedule
from .common import routed, update_actions
from .corrections import check_corrections, warmup_iterations
from .registry import Shape

__all__ = [
    "Counts", "Tags", "VersionRule", "warmup_depth", "async_order", "async_layout", "build_async",
    "DRAIN", "drain_every", "drain_segments", "update_segments",
]

DRAIN = "drain"
"""The option every asynchronous schedule takes: drain after every ``N``-th iteration."""


@dataclass(frozen=True)
class Counts:
    """Updates a stage's replica had made when it ran one micro-batch's forward and backward.

    Attributes:
        forward: ``U`` actions of the stage before the forward on its rank (the latest version).
        backward: ``U`` actions of the stage before the backward (the current weights then).
    """

    forward: int
    backward: int
    drained: int = 0
    """Updates the stage had made at the start of the micro-batch's drained segment (the
    version every stage holds there; 0 without ``drain``)."""

    @property
    def between(self) -> int:
        """Updates between the forward and its backward (PipeOptim's exact ``s``)."""
        return self.backward - self.forward


@dataclass(frozen=True)
class Tags:
    """Version annotations of one micro-batch's forward and backward on one stage."""

    forward_version: int
    backward_version: int
    forward_lookahead: int = 0
    backward_lookahead: int = 0


VersionRule = Callable[[int, int, Mapping[tuple[int, int], Counts]], Tags]
"""``rule(stage, microbatch, counts)``: the tags of that micro-batch on that stage, given the
counts of every ``(stage, microbatch)`` (vertical sync looks at stage 0's)."""


def warmup_depth(layout: Layout, stage: int) -> int:
    """Micro-batches each replica of ``stage`` admits before its first backward (module docstring)."""
    downstream = sum(layout.replicas(t) for t in range(stage, layout.num_stages))
    return math.ceil(downstream / layout.replicas(stage))


def async_order(depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
    """``depth`` forwards, then alternate backward/forward, then drain the backwards.

    ``depth=3`` over ``0..4``: F0 F1 F2 B0 F3 B1 F4 B2 B3 B4.
    """
    n = len(microbatches)
    warmup = min(depth, n)
    order = [(Op.FORWARD, microbatches[i]) for i in range(warmup)]
    for i in range(n - warmup):
        order.append((Op.BACKWARD, microbatches[i]))
        order.append((Op.FORWARD, microbatches[warmup + i]))
    order.extend((Op.BACKWARD, microbatches[i]) for i in range(n - warmup, n))
    return order


def drain_every(name: str, shape: Shape) -> int | None:
    """The shape's ``drain`` option, checked (None: no drain)."""
    every = shape.option(DRAIN, None)
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(
            f"{name} option drain must be an integer >= 1 (iterations between drains), got "
            f"{every!r}; e.g. --option drain=50, or leave it out for no drain")
    return every


def drain_segments(name: str, shape: Shape) -> list[range]:
    """The iterations of each drained segment: ``N`` at a time with option ``drain=N``
    (the last one shorter if ``N`` does not divide ``K``), all ``K`` in one without; with
    option ``warmup=W`` (:mod:`.corrections`) each of the first ``W`` iterations is a segment
    of its own, so it starts on the weights the one before it reached."""
    every = drain_every(name, shape)
    check_corrections(name, shape)
    warmup = min(warmup_iterations(name, shape), shape.iterations)
    step = shape.iterations if every is None else every
    drained = [range(a, min(a + step, shape.iterations)) for a in range(0, shape.iterations, step)]
    segments = [range(b, b + 1) for b in range(warmup)]
    for segment in drained:
        if segment.stop > warmup:
            segments.append(range(max(segment.start, warmup), segment.stop))
    return segments


def update_segments(name: str, shape: Shape, layout: Layout,
                    period: Callable[[int], int]) -> list[range]:
    """The micro-batches of each segment of :func:`drain_segments`, a warm-up iteration cut
    further into one update's micro-batches (``period(s) * replicas(s)``, the same on every
    stage), so that no forward of a warm-up iteration runs before the update before it."""
    m = shape.microbatches
    warmup = warmup_iterations(name, shape)
    sizes = {period(s) * layout.replicas(s) for s in range(layout.num_stages)}
    if warmup and len(sizes) > 1:
        raise ValueError(
            f"{name} option warmup needs every stage to update after the same micro-batches, but "
            f"its stages update every {sorted(sizes)} micro-batches (unequal replicas); use equal "
            f"replicas or drop warmup")
    size = sizes.pop()
    segments: list[range] = []
    for segment in drain_segments(name, shape):
        mbs = range(segment.start * m, segment.stop * m)
        step = size if segment.start < warmup else len(mbs)
        segments.extend(range(a, min(a + step, mbs.stop)) for a in range(mbs.start, mbs.stop, step))
    return segments


def async_layout(name: str, shape: Shape) -> Layout:
    """The shape's layout, checked for what the asynchronous schedules support."""
    if shape.chunks != 1:
        raise ValueError(
            f"schedule {name!r} runs one stage per rank, got chunks={shape.chunks}; use chunks=1 "
            "(interleaved virtual stages have their own schedules)"
        )
    if shape.pipelines != 1:
        raise ValueError(
            f"schedule {name!r} lays out one pipeline, got pipelines={shape.pipelines}; use "
            "pipelines=1 (parallel pipelines are AvgPipe's schedules)"
        )
    layout = shape.layout()
    for stage in range(layout.num_stages):
        replicas = layout.replicas(stage)
        if shape.microbatches % replicas:
            fix = replicas * math.ceil(shape.microbatches / replicas)
            raise ValueError(
                f"schedule {name!r}: stage {stage} has {replicas} replicas, which synchronise every "
                f"round of {replicas} micro-batches, so microbatches must be a multiple of "
                f"{replicas}; got {shape.microbatches}, use e.g. {fix}"
            )
    return layout


def build_async(
    name: str, shape: Shape, layout: Layout, *, period: Callable[[int], int], rule: VersionRule,
) -> Schedule:
    """Lay out the asynchronous order with updates and version tags.

    Args:
        name: schedule name (for the record and error messages).
        shape: the requested shape.
        layout: ``async_layout(name, shape)``.
        period: ``period(stage)``: rounds (local backwards of one replica) per update.
        rule: turns update counts into the version tags of each forward/backward.
    """
    segments = update_segments(name, shape, layout, period)
    skeletons: list[list[tuple[Op, int | None]]] = []
    counts: dict[tuple[int, int], Counts] = {}
    for rank in range(layout.num_ranks):
        (stage,) = layout.stages_of(rank)
        skeleton: list[tuple[Op, int | None]] = []
        updates = backwards = 0
        for segment in segments:
            mbs = routed(layout, stage, rank, segment)
            forward_at: dict[int, int] = {}
            drained = updates
            for op, j in async_order(warmup_depth(layout, stage), mbs):
                skeleton.append((op, j))
                if op is Op.FORWARD:
                    forward_at[j] = updates
                    continue
                counts[(stage, j)] = Counts(forward_at[j], updates, drained)
                backwards += 1
                if backwards % period(stage) == 0:
                    updates += 1
                    skeleton.append((Op.STEP, None))
            assert backwards % period(stage) == 0, (name, stage, backwards)
        skeletons.append(skeleton)

    programs: list[list[Action]] = []
    for rank, skeleton in enumerate(skeletons):
        (stage,) = layout.stages_of(rank)
        program: list[Action] = []
        version = 0
        for op, mb in skeleton:
            if mb is None:
                version += 1
                program.extend(update_actions(layout, stage, version))
                continue
            tags = rule(stage, mb, counts)
            if op is Op.FORWARD:
                program.append(Action(op, stage, mb, version=tags.forward_version,
                                      lookahead=tags.forward_lookahead))
            else:
                program.append(Action(op, stage, mb, version=tags.backward_version,
                                      lookahead=tags.backward_lookahead))
        programs.append(program)
    return Schedule(
        name=name, layout=layout, microbatches=shape.microbatches, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=False, options=dict(shape.options),
    )
