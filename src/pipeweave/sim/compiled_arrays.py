"""The compiled walk (:mod:`pipeweave.sim.compiled`) of a flush schedule given as arrays.

:func:`~pipeweave.sim.compiled.compile_schedule` finds each action's edges by asking
:func:`~pipeweave.ir.dependencies` action by action, then levels them in numpy. For the
regular flush schedules of :mod:`pipeweave.schedules.flush_arrays` the edges are known in
closed form and found here in numpy, with no :class:`~pipeweave.ir.Action` built:

* each action after the first of its rank waits for the rank's previous one (an ``AR`` of one
  copy has itself as its only replica: the same edge);
* a forward of micro-batch ``j`` on stage ``s > 0`` waits for stage ``s - 1``'s forward of
  ``j`` (a Slicer half for the same half, which lasts half its forward and sends half its
  transfer), a backward (or its ``I``) on stage ``s < S - 1`` for stage ``s + 1``'s backward of
  ``j`` (or its ``I``; a ``W`` waits for nothing but its rank): a data
  edge (latency and the transfer at boundary ``min`` of the two stages) across ranks, a
  plain one on the same rank.

The graph is then levelled and timed by the same code (:func:`~pipeweave.sim.compiled.
longest_chains`, :func:`~pipeweave.sim.compiled.assemble`, :meth:`Compiled.times`), so the
same additions and maxima as the walk, and :func:`time_arrays` reads the makespan, iteration
time and bubble as :func:`~pipeweave.sim.simulate_timing` does: the same numbers to the last
bit (``tests/sim/test_compiled_arrays.py`` compares them on many shapes and costs).
"""

from __future__ import annotations

import numpy as np

from ..ir import Op, Schedule
from ..schedules.flush_arrays import OPS, PASSES, ArrayPrograms
from . import metrics
from .compiled import DATA, ROW, SAME, Compiled, assemble, longest_chains
from .halves import HALF, TWO_HALVES
from .costs import Costs
from .simulator import Timing

__all__ = ["compile_arrays", "time_arrays", "column_edges", "action_columns",
           "compile_columns"]

_CODE_ROW = np.array([ROW[op] for op in OPS], dtype=np.int64)


def compile_arrays(programs: ArrayPrograms) -> Compiled:
    """``programs``' graph compiled (module docstring)."""
    count = int(sum(programs.lengths))
    piece = np.zeros(count, dtype=np.int8) if programs.piece is None else programs.piece
    edges = column_edges(programs.op, programs.stage, programs.microbatch, piece,
                         programs.lengths, programs.layout.num_stages)
    assert edges is not None, "a flush order has every producer"
    level = longest_chains(edges[0], edges[1], count)
    assert level is not None, "a flush order has no cycle"
    return assemble(edges, level, _CODE_ROW[programs.op], programs.stage,
                    _factors(programs.op, programs.stage, programs.microbatch, piece),
                    programs.lengths)


def _factors(op: np.ndarray, stage: np.ndarray, micro: np.ndarray, piece: np.ndarray
             ) -> np.ndarray:
    """:func:`~pipeweave.sim.halves.piece_factor` in numpy: a Slicer half ``HALF``, a
    backward (``B``, ``I``, ``W``) of a micro-batch its stage forwarded in halves
    ``TWO_HALVES``, else 1."""
    factor = np.where(piece > 0, HALF, 1.0)
    halved = (op == OPS.index(Op.FORWARD)) & (piece > 0)
    if not halved.any():
        return factor
    passes = int(micro.max()) + 1
    sliced = np.zeros((int(stage.max()) + 1) * passes, dtype=bool)
    sliced[stage[halved] * passes + micro[halved]] = True
    backward = np.isin(op, [OPS.index(o) for o in _BACKWARDS])
    where = np.flatnonzero(backward)
    factor[where[sliced[stage[where] * passes + micro[where]]]] = TWO_HALVES
    return factor


def action_columns(schedule: Schedule) -> tuple[np.ndarray, ...] | None:
    """``(op, stage, micro-batch, piece)`` of every action of a compute-only schedule whose
    stages each run on one rank, one pipeline (no sends, receives, checks or all-reduce
    among replicas), rank-major: what :func:`column_edges` reads; None for any other."""
    layout = schedule.layout
    if schedule.lowered or any(len(r) != 1 for r in layout.stage_ranks):
        return None
    fields = list(zip(*(a for program in schedule.programs for a in program)))
    if not fields:
        return None
    ops, stage, micro, piece, _, _, pipeline = fields
    if not set(ops) <= _CODES.keys() or any(pipeline):
        return None
    count = len(ops)
    return (np.fromiter(map(_CODES.__getitem__, ops), np.int8, count),
            np.fromiter(stage, np.int64, count),
            np.fromiter((-1 if j is None else j for j in micro), np.int64, count),
            np.fromiter(piece, np.int8, count))


def compile_columns(schedule: Schedule, columns: tuple[np.ndarray, ...],
                    min_width: int) -> Compiled | None:
    """:func:`~pipeweave.sim.compiled.compile_schedule` of a schedule read as columns
    (:func:`action_columns`): the same graph, its edges found in numpy; None where a
    producer is missing, the edges have a cycle or the levels are too narrow, as there."""
    op, stage, micro, piece = columns
    lengths = tuple(len(p) for p in schedule.programs)
    edges = column_edges(op, stage, micro, piece, lengths, schedule.num_stages)
    if edges is None:
        return None
    level = longest_chains(edges[0], edges[1], len(op))
    if level is None or len(level) < min_width * (int(level.max()) + 1):
        return None
    return assemble(edges, level, _CODE_ROW[op], stage, _factors(op, stage, micro, piece),
                    lengths)


_CODES = {op: code for code, op in enumerate(OPS)}
_BACKWARDS = (Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)


def column_edges(op: np.ndarray, stage: np.ndarray, micro: np.ndarray, piece: np.ndarray,
                 lengths: tuple[int, ...], stages: int) -> tuple[np.ndarray, ...] | None:
    """Every edge as ``(target, source, kind, boundary, half)`` (module docstring), found
    in numpy from the actions' columns; None where a producer is missing (the walk then
    raises its error)."""
    count = len(op)
    every = np.arange(count)
    rank = np.repeat(np.arange(len(lengths)), lengths)
    first = np.zeros(count, dtype=bool)
    first[np.cumsum((0,) + lengths[:-1])[np.asarray(lengths) > 0]] = True
    same = every[~first]
    passes = micro.max(initial=0) + 1
    forward = op == OPS.index(Op.FORWARD)
    gradient = (op == OPS.index(Op.BACKWARD)) | (op == OPS.index(Op.BACKWARD_INPUT))
    piece = piece.astype(np.int64)
    computing = forward | gradient
    # an I is found as the B it splits (ir.deps.ref): what the previous stage waits for; a
    # Slicer half waits for the same half (gradients are whole: piece 0)
    key = ((gradient.astype(np.int64) * stages + stage) * passes + micro) * 3 + piece
    found = np.full(2 * stages * passes * 3, -1, dtype=np.int64)
    found[key[computing]] = every[computing]
    needs = np.where(forward, stage > 0, gradient & (stage < stages - 1))
    target = every[needs]
    step = np.where(forward[needs], -1, 1)
    source = found[key[needs] + step * passes * 3]
    if not np.all(source >= 0):
        return None
    crossing = rank[source] != rank[target]
    kind = np.concatenate([np.full(len(same), SAME), np.where(crossing, DATA, SAME)])
    boundary = np.concatenate([np.full(len(same), -1), np.where(
        crossing, np.minimum(stage[source], stage[target]), -1)])
    half = np.concatenate([np.zeros(len(same), dtype=bool), crossing & (piece[source] > 0)])
    return (np.concatenate([same, target]), np.concatenate([same - 1, source]),
            kind.astype(np.int8), boundary, half)


def time_arrays(programs: ArrayPrograms, compiled: Compiled, costs: Costs) -> Timing | None:
    """:func:`~pipeweave.sim.simulate_timing` of ``programs`` (compiled by
    :func:`compile_arrays`) under ``costs``; None with ranks sharing cores (their walk is
    another one, :mod:`pipeweave.sim.shared_cores`)."""
    table = costs.resolve(programs.layout.num_stages)
    if table.shared_cores is not None and table.shared_cores < programs.num_ranks:
        return None
    start, end = compiled.times(table)
    cut = np.cumsum((0,) + programs.lengths)
    makespan = max((float(end[b - 1]) for a, b in zip(cut[:-1], cut[1:]) if b > a),
                   default=0.0)
    spans = np.where(np.isin(programs.op, PASSES), end - start, np.nan)
    busy = []
    for a, b in zip(cut[:-1].tolist(), cut[1:].tolist()):
        run = spans[a:b]
        busy.append(sum(run[~np.isnan(run)].tolist()))  # summed in order, as the walk's
    window = (0.0, makespan)
    return Timing(makespan=makespan, iteration_time=makespan / programs.iterations,
                  window=window, bubble_fraction=metrics.bubble_fraction(busy, window))
