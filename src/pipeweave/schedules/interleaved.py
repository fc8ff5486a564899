"""Interleaved 1F1B (Megatron-LM): ``v`` model chunks (virtual stages) per rank.

Rank ``r`` holds stages ``r, r+P, ..., r+(v-1)P`` (:meth:`Layout.chunked`), so a micro-batch
visits every rank ``v`` times and the warm-up bubble shrinks by ``v``. Megatron's rule, per
rank: micro-batches go through the chunks in runs of ``P`` (chunk 0 for micro-batches 0..P-1,
then chunk 1 for the same run, ...), backwards visit the chunks in reverse; a warm-up of
``(P - r - 1) * 2 + (v - 1) * P`` forwards (at most ``M * v``), then one forward / one
backward, then the cool-down. This needs ``M % P == 0``.

P=2, v=2, M=2 (stage ``s`` on rank ``s % 2``), unit-cost timeline::

    rank0  0F0 0F1 2F0 2F1 .   .   .   2B0 2B1 0B0 0B1
    rank1  .   1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1 .   .

With ``chunks=1`` it is plain ``1f1b`` (Megatron runs its non-interleaved schedule then).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Op, Schedule
from .common import flush_schedule, one_f_one_b_order, routed, update_actions
from .registry import Shape, register

__all__ = ["interleaved_1f1b", "interleaved_order"]


def interleaved_order(
    rank: int, ranks: int, chunks: int, microbatches: Sequence[int]
) -> list[tuple[Op, int, int]]:
    """Megatron's interleaved F/B sequence for one rank: ``(op, stage, micro-batch)`` triples.

    Args:
        rank: the rank's position in its pipeline copy (0..P-1).
        ranks: P, ranks per pipeline copy.
        chunks: v, chunks per rank.
        microbatches: the micro-batches this rank runs in one iteration (a multiple of P).
    """
    n = len(microbatches)
    assert n % ranks == 0, (n, ranks)
    total = n * chunks
    group = ranks * chunks

    def stage(k: int, forward: bool) -> int:
        chunk = (k % group) // ranks  # runs of P virtual micro-batches per chunk
        if not forward:
            chunk = chunks - 1 - chunk  # backwards walk the chunks in reverse
        return chunk * ranks + rank

    def microbatch(k: int) -> int:
        return microbatches[(k // group) * ranks + k % ranks]

    warmup = min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total)
    order = [(Op.FORWARD, stage(k, True), microbatch(k)) for k in range(warmup)]
    for i in range(total - warmup):
        order.append((Op.FORWARD, stage(warmup + i, True), microbatch(warmup + i)))
        order.append((Op.BACKWARD, stage(i, False), microbatch(i)))
    order.extend((Op.BACKWARD, stage(k, False), microbatch(k)) for k in range(total - warmup, total))
    return order


def _min_microbatches(shape: Shape) -> int:
    return shape.stages * shape.width if shape.chunks > 1 else 1


@register("interleaved-1f1b",
          description="Megatron interleaved 1F1B: v chunks per rank in runs of P, flush per iteration",
          paper="D. Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, SC 2021 (interleaved schedule)",
          synchronous=True, min_microbatches=_min_microbatches, default_chunks=2,
          width=True, replicas=True, chunks=None, torch_schedule="Interleaved1F1B")
def interleaved_1f1b(shape: Shape) -> Schedule:
    if shape.chunks == 1:
        return flush_schedule("interleaved-1f1b", shape, one_f_one_b_order)
    check_interleaved_shape("interleaved-1f1b", shape)
    layout = shape.layout()
    P, M = shape.stages, shape.microbatches
    programs: list[list[Action]] = []
    for global_rank in range(layout.num_ranks):
        program: list[Action] = []
        stages = layout.stages_of(global_rank)
        for k in range(shape.iterations):
            mbs = routed(layout, stages[0], global_rank, range(k * M, (k + 1) * M))
            for op, stage, j in interleaved_order(global_rank % P, P, shape.chunks, mbs):
                program.append(Action(op, stage, j, version=k))
            for stage in stages:
                program.extend(update_actions(layout, stage, k + 1))
        programs.append(program)
    return Schedule(
        name="interleaved-1f1b", layout=layout, microbatches=M, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=True, options=dict(shape.options),
    )


def check_interleaved_shape(name: str, shape: Shape) -> None:
    """``name`` keeps Megatron's interleaved order: no per-stage replicas, and M a multiple of
    P x width (micro-batches go in runs of P per chunk); ValueError naming the fix."""
    if shape.replicas is not None:
        raise ValueError(f"{name} does not support per-stage replicas; use width for "
                         "data parallelism")
    per_copy, rest = divmod(shape.microbatches, shape.width)
    if rest or per_copy % shape.stages:
        step = shape.stages * shape.width
        fix = ((shape.microbatches + step - 1) // step) * step
        raise ValueError(
            f"{name} needs microbatches (M={shape.microbatches}) to be a multiple of "
            f"stages x width (P={shape.stages} x {shape.width}): Megatron groups micro-batches in "
            f"runs of P per chunk; use M={fix} (or chunks=1)"
        )