"""The programs of the regular flush schedules as integer arrays, built in numpy.

At planning scale a surviving candidate is a 256-512-stage pipeline of thousands of
micro-batches: its schedule is millions of :class:`~pipeweave.ir.Action` records, built one
by one in Python (seconds), then indexed and walked. Here the synchronous schedules of one
pipeline copy are laid out as columns instead: per action, its op, stage, micro-batch and
weight version (and, for the Slicer, its half), rank-major, in numpy. Where a rank's order
is a closed form, GPipe, 1F1B (and every schedule that is 1F1B with one chunk, AvgPipe with
one pipeline among them: an ``AV`` after each update), Megatron's interleaved 1F1B, WPipe's
GPipe grouping and ZB-H1/H2 (without the global check), no pass is built in Python at all;
the first three share one pattern (:func:`~pipeweave.schedules.pass_columns.pattern`): a
warm-up of ``w`` forwards, then one forward and one backward, then the cool-down (GPipe:
``w = n``; 1F1B: ``w = min(S - s - 1, n)`` per stage; interleaved: Megatron's ``w`` per
rank); GPipe grouping runs every forward of a rank's stages, then every backward, in runs of
``M``; ZB-H1/H2 split each backward into ``I`` and ``W`` and defer the ``W``'s
(:func:`~pipeweave.schedules.zero_bubble.split_order`); sliced 1F1B is 1F1B with the first
``k`` forwards of each iteration halved in place (``k`` the generator's own
:func:`~pipeweave.schedules.sliced.sliced_count`). The schedules whose order is found by
list scheduling (ZB-V, V-Min, V-Half, DualPipeV, interleaved ZB) take their passes as
columns from :mod:`.copy_orders`, built without a pass tuple each and kept per shape.

The generators stay the reference: :meth:`ArrayPrograms.programs` gives back the same
actions, and ``tests/schedules/test_flush_arrays.py`` compares them action for action with
the registered generators on many shapes. Only what the search times is covered: one
pipeline copy (width 1, no per-stage replicas, one pipeline, no options but the Slicer's);
anything else is ``None`` and goes to the generator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..ir import Action, Layout
from .common import CopyOrder
from .copy_orders import Rows, copy_rows
from .dualpipev import dualpipev, dualpipev_order
from .gpipe import gpipe
from .gpipe_grouped import gpipe_grouped
from .interleaved import interleaved_1f1b
from .interleaved_zb import interleaved_zb, interleaved_zb_order
from .one_f_one_b import one_f_one_b
from .avgpipe import avgpipe
from .pass_columns import AR, AV, B, F, I, OPS, PASSES, U, W, interleaved_rows, pattern
from .registry import Shape, get_info
from .sliced import sliced_1f1b, sliced_count
from .v_blocks import _v_half_order, _v_min_order, v_half, v_min
from .zbv import zbv, zbv_order
from .zero_bubble import zb_h1, zb_h2

__all__ = ["ArrayPrograms", "flush_arrays", "OPS", "PASSES", "columns_shape"]

_F, _B, _I, _W = F, B, I, W
Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A run of actions: op codes, stages, micro-batches (-1: none), versions."""


@dataclass(frozen=True, eq=False)
class ArrayPrograms:
    """A compute-only flush schedule's programs as columns, rank-major (module docstring)."""

    layout: Layout
    microbatches: int
    iterations: int
    op: np.ndarray
    """Code of each action's op in :data:`OPS`."""
    stage: np.ndarray
    microbatch: np.ndarray
    """-1 for an update or all-reduce."""
    version: np.ndarray
    lengths: tuple[int, ...]
    """Actions per rank."""
    piece: np.ndarray | None = None
    """0 for a whole micro-batch, 1/2 for a Slicer half (None: no halves)."""

    @property
    def num_ranks(self) -> int:
        return len(self.lengths)

    def programs(self) -> tuple[tuple[Action, ...], ...]:
        """The same programs as :class:`~pipeweave.ir.Action` records (the generators' form)."""
        ops = [OPS[c] for c in self.op.tolist()]
        pieces = [0] * len(ops) if self.piece is None else self.piece.tolist()
        rows = zip(ops, self.stage.tolist(), self.microbatch.tolist(), pieces,
                   self.version.tolist())
        flat = [Action(op, s, None if j < 0 else j, h, version=v) for op, s, j, h, v in rows]
        cut = np.cumsum((0,) + self.lengths).tolist()
        return tuple(tuple(flat[a:b]) for a, b in zip(cut, cut[1:]))

    def held_peak_bytes(self, sizes: Sequence[float]) -> list[float]:
        """:func:`pipeweave.memory.held_counts.held_peak_bytes` of these programs: per rank,
        the most activation bytes held at once, from the same counts (a row per forward of
        the activations held of each of the rank's stages) weighed the same way."""
        weights = np.asarray(sizes, dtype=float)
        return [float((counts @ weights[stages]).max()) if len(counts) else 0.0
                for stages, counts in self._held_counts]

    @cached_property
    def _held_counts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        cut = np.cumsum((0,) + self.lengths).tolist()
        piece = np.zeros(len(self.op), dtype=np.int8) if self.piece is None else self.piece
        return [_rank_counts(self.op[a:b], self.stage[a:b], piece[a:b])
                for a, b in zip(cut, cut[1:])]


def _rank_counts(op: np.ndarray, stage: np.ndarray, piece: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(stages, counts)`` of one rank as :mod:`pipeweave.memory.held_counts` counts them:
    a forward holds one activation of its stage (a Slicer half 0.5) until its backward
    releases the whole."""
    passes = (op == _F) | (op == _B) | (op == _W)  # an I leaves it to its W
    forward = op[passes] == _F
    stages = np.unique(stage[passes][forward])
    column = np.searchsorted(stages, stage[passes])
    change = np.zeros((len(column), len(stages)))
    share = np.where(piece[passes] > 0, 0.5, 1.0)
    change[np.arange(len(column)), column] = np.where(forward, share, -1.0)
    return stages, np.cumsum(change, axis=0)[forward]


def flush_arrays(name: str, shape: Shape, *, reduce_before_step: bool = False
                 ) -> ArrayPrograms | None:
    """``build_schedule(name, shape)``'s programs as arrays; with ``reduce_before_step`` an
    ``AR`` before every ``U`` (:func:`pipeweave.auto.copies.one_copy_schedule`'s copy 0).
    None: not a shape or schedule covered here (module docstring)."""
    info = get_info(name)  # its generator, not its name: a name registered anew is not ours
    if (shape.width != 1 or shape.replicas is not None or shape.pipelines != 1
            or shape.microbatches < info.min_microbatches(shape)):
        return None
    sliced = info.generate is sliced_1f1b
    if shape.options and not (sliced and set(shape.options) <= {"sliced", "costs"}):
        return None
    passes = _rule(info.generate, shape)
    if passes is None:
        return None
    layout = info.layout(shape)
    update = ([AR] if reduce_before_step else []) + [U] + ([AV] if info.generate is avgpipe else [])
    columns = [_rank(passes, shape, layout, r, update) for r in range(layout.num_ranks)]
    op, stage, micro, version = (np.concatenate([c[i] for c in columns]) for i in range(4))
    table: Columns = (op, stage, micro, version)
    lengths = tuple(len(c[0]) for c in columns)
    piece = None
    if sliced:  # the generator's own count (and its errors)
        table, piece, lengths = _halved(table, lengths, sliced_count(shape), shape.microbatches)
    op, stage, micro, version = table
    return ArrayPrograms(layout=layout, microbatches=shape.microbatches,
                         iterations=shape.iterations, op=op.astype(np.int8), stage=stage,
                         microbatch=micro, version=version, lengths=lengths, piece=piece)


def columns_shape(name: str, shape: Shape) -> Shape:
    """A shape whose columns are ``shape``'s, keyed by what they depend on: sliced 1F1B's
    Slicer costs (one set per partition) become the count they give, so a cache keyed by
    shape lays out every partition's halves once."""
    if get_info(name).generate is not sliced_1f1b or not shape.options \
            or not set(shape.options) <= {"sliced", "costs"}:
        return shape
    return replace(shape, options={"sliced": sliced_count(shape)})


def _halved(table: Columns, lengths: tuple[int, ...], count: int, M: int
            ) -> tuple[Columns, np.ndarray, tuple[int, ...]]:
    """:func:`~pipeweave.schedules.sliced.sliced_1f1b`'s slicing: every forward of the first
    ``count`` micro-batches of each iteration replaced, in place, by its halves 1 and 2."""
    op, _, micro, _ = table
    split = (op == _F) & (micro % M < count)
    copies = np.where(split, 2, 1)
    index = np.repeat(np.arange(len(op)), copies)
    second = np.arange(len(index)) - np.repeat(np.cumsum(copies) - copies, copies)
    piece = np.where(split[index], second + 1, 0).astype(np.int8)
    rank = np.repeat(np.arange(len(lengths)), lengths)
    grown = np.bincount(rank, weights=copies, minlength=len(lengths)).astype(np.int64)
    return (op[index], table[1][index], micro[index], table[3][index]), piece, \
        tuple(grown.tolist())


Passes = Callable[[int, int], list[Columns]]
"""``passes(rank, base)``: a rank's passes of the iteration whose first micro-batch is
``base``, as runs of columns."""


def _rule(generate: object, shape: Shape) -> Passes | None:
    """How ``generate`` orders ``shape``'s passes, or None where it is not covered (or
    the generator refuses the shape, with its own message)."""
    P, v, M = shape.stages, shape.chunks, shape.microbatches
    if v > 1 and generate in (interleaved_1f1b, interleaved_zb) and M % P:
        return None
    if generate is gpipe_grouped:
        return lambda rank, base: [_grouped(shape, rank, base)]
    if v > 1 and generate is interleaved_1f1b:
        return lambda rank, base: [_interleaved(shape, rank, base)]
    if v > 1 and (generate in _V_ORDERS or generate is interleaved_zb):
        order = interleaved_zb_order if generate is interleaved_zb else _V_ORDERS.get(generate)
        if order is None or (v != 2 and generate is not interleaved_zb):
            return None
        return _copy_passes(copy_rows(order, P, M, v), M)
    per_stage = _PER_STAGE.get(generate)
    if v > 1 or per_stage is None:  # stages in turn on one rank would wait for themselves
        return None
    return lambda rank, base: [per_stage(shape, P, rank, base)]


def _rank(passes: Passes, shape: Shape, layout: Layout, rank: int, update: list[int]
          ) -> Columns:
    """One rank's columns: each iteration's passes, then each of its stages' ``update``
    (``AR`` before the step on copy 0 of several, AvgPipe's ``AV`` after it)."""
    parts: list[Columns] = []
    stages = layout.stages_of(rank)
    for k in range(shape.iterations):
        parts.extend(passes(rank, k * shape.microbatches))
        count = len(stages) * len(update)
        parts.append((np.tile(update, len(stages)), np.repeat(stages, len(update)),
                      np.full(count, -1), np.full(count, k + 1)))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))  # type: ignore


def _copy_passes(rows: tuple[Rows, ...], M: int) -> Passes:
    """A copy's passes found by its order function (list scheduling: ZB-V, V-Min, V-Half,
    DualPipeV, interleaved ZB; :func:`~pipeweave.schedules.common.copies_schedule`), laid
    out as columns by :mod:`.copy_orders` and shifted to each iteration's micro-batches."""
    def passes(rank: int, base: int) -> list[Columns]:
        op, stage, i = rows[rank]
        return [(op, stage, base + i, np.full(len(op), base // M))]
    return passes


def _per_stage(shape: Shape, stage: int, base: int, warmup: int) -> Columns:
    forward, k = pattern(shape.microbatches, warmup)
    n = len(k)
    return (np.where(forward, _F, _B), np.full(n, stage), base + k,
            np.full(n, base // shape.microbatches))


def _gpipe(shape: Shape, depth: int, stage: int, base: int) -> Columns:
    return _per_stage(shape, stage, base, shape.microbatches)


def _one_f_one_b(shape: Shape, depth: int, stage: int, base: int) -> Columns:
    return _per_stage(shape, stage, base, depth - stage - 1)


def _interleaved(shape: Shape, rank: int, base: int) -> Columns:
    """:func:`~pipeweave.schedules.interleaved.interleaved_order` of ``rank``, vectorised."""
    op, stage, micro = interleaved_rows(shape.stages, shape.chunks, shape.microbatches, rank)
    return op, stage, base + micro, np.full(len(op), base // shape.microbatches)


def _grouped(shape: Shape, rank: int, base: int) -> Columns:
    """:func:`~pipeweave.schedules.gpipe_grouped.grouped_order` of ``rank``: every forward
    of its stages in ascending order, then every backward of them in descending order."""
    P, v, M = shape.stages, shape.chunks, shape.microbatches
    stages = np.arange(v) * P + rank
    order = np.concatenate([stages, stages[::-1]])
    return (np.repeat(np.where(np.arange(2 * v) < v, _F, _B), M), np.repeat(order, M),
            base + np.tile(np.arange(M), 2 * v), np.full(2 * v * M, base // M))


def _zb_h1(shape: Shape, depth: int, stage: int, base: int) -> Columns:
    return _split(shape, stage, base, depth - stage - 1, stage)


def _zb_h2(shape: Shape, depth: int, stage: int, base: int) -> Columns:
    return _split(shape, stage, base, 2 * (depth - stage - 1), 2 * stage)


def _split(shape: Shape, stage: int, base: int, warmup: int, defer: int) -> Columns:
    """:func:`~pipeweave.schedules.zero_bubble.split_order`: ``warmup`` forwards; per
    micro-batch ``k`` the next forward, ``I_k``, ``W_{k-defer}``; then the deferred ``W``'s."""
    n = shape.microbatches
    w = min(warmup, n)
    k = np.arange(n)
    ops = np.tile(np.array([_F, _I, _W]), (n, 1))
    index = np.stack([w + k, k, k - defer], axis=1)
    keep = np.stack([w + k < n, np.ones(n, bool), k >= defer], axis=1)
    done = max(n - defer, 0)  # W's run in the loop
    op = np.concatenate([np.full(w, _F), ops[keep], np.full(n - done, _W)])
    micro = np.concatenate([np.arange(w), index[keep], np.arange(done, n)])
    return (op, np.full(len(op), stage), base + micro, np.full(len(op), base // n))


_PER_STAGE: dict[object, Callable[[Shape, int, int, int], Columns]] = {
    gpipe: _gpipe, one_f_one_b: _one_f_one_b, zb_h1: _zb_h1, zb_h2: _zb_h2,
    avgpipe: _one_f_one_b,  # one pipeline, no advance: 1F1B, an AV after each update
    sliced_1f1b: _one_f_one_b,  # then its first forwards halved (_halved)
    # with one chunk these lay out plain 1F1B (``v_schedule``, ``interleaved_zb``)
    interleaved_1f1b: _one_f_one_b, interleaved_zb: _one_f_one_b, zbv: _one_f_one_b,
    v_half: _one_f_one_b, v_min: _one_f_one_b, dualpipev: _one_f_one_b}
"""The schedules whose rank runs one stage's closed-form order, by generator."""

_V_ORDERS: dict[object, CopyOrder] = {zbv: zbv_order, v_half: _v_half_order,
                                      v_min: _v_min_order, dualpipev: dualpipev_order}
"""The V schedules' order functions (two chunks), by generator."""
