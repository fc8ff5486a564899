"""AutoPipe's iteration time and master stage of a flush schedule given as arrays.

AutoPipe's search (:mod:`pipeweave.planner.autopipe`) times one 1F1B shape under many
splits and reads its iteration time and master stage (:func:`pipeweave.sim.simulate_path`).
At planning scale (256 stages, thousands of micro-batches) the first of those timings cost
seconds to tens of seconds: the schedule built as millions of
:class:`~pipeweave.ir.Action` records, indexed and compiled. Here the same shape is laid
out as columns (:func:`pipeweave.schedules.flush_arrays.flush_arrays`), compiled in numpy
(:func:`pipeweave.sim.compiled_arrays.compile_arrays`, the same times to the last bit) and
kept per shape (:data:`CACHE_SIZE`, :data:`CACHE_ACTIONS`), and the critical path is walked back over those
columns by the rules of :mod:`pipeweave.sim.critical_path`::

    last compute action: each rank's last F/B/I/W, the latest end (ties: lower stage, rank)
    predecessor: the rank's previous action, and the action's one producer (F from F on
        stage s - 1, B or I from the B or I on stage s + 1) plus its delay across ranks,
        each kept when it ends within 1e-9 (relative) of the start; the greatest
        (stage, same rank, location) is followed
    master stage: the most F/B/I/W time on the path, summed first action first (ties: later)

the same comparisons on the same floats, so the same path and numbers
(``tests/sim/test_path_arrays.py`` compares them with :func:`simulate_path` on many shapes,
costs and delays).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict

import numpy as np

from ..ir import Op
from ..schedules import Shape
from ..schedules.flush_arrays import OPS, PASSES, ArrayPrograms, flush_arrays
from .compiled import Compiled
from .compiled_arrays import compile_arrays
from .costs import Costs, StageCosts
from .simulator import PathTiming

__all__ = ["FlushGraph", "flush_graph", "path_arrays", "CACHE_SIZE", "CACHE_ACTIONS"]

CACHE_SIZE = 16
"""Shapes kept at most (least recently used dropped); AutoPipe times one shape many times in
a row, and ``pipeweave auto`` asks it for the same (stages, micro-batches) again at another
micro-batch size, other shapes between."""

CACHE_ACTIONS = 2 ** 22
"""Actions kept over every shape (about 100 bytes each: 420 MB), the least recently used
shape dropped past it, the last one always kept: two of the largest at planning scale
(512 stages x 2,048 micro-batches, 2M actions), what two shapes of any size were before."""

FlushGraph = tuple[ArrayPrograms, Compiled, np.ndarray]
"""A shape's columns, their compiled graph and each action's producer (-1: none)."""

_CACHE: OrderedDict[tuple[object, ...], FlushGraph | None] = OrderedDict()


def flush_graph(name: str, shape: Shape) -> FlushGraph | None:
    """Schedule ``name`` laid out for ``shape`` as columns, compiled, with each action's
    producer; None where :func:`flush_arrays` does not cover it. Kept per shape."""
    if shape.options:  # not covered by flush_arrays, and not a key
        return None
    key = (name, shape.stages, shape.microbatches, shape.iterations, shape.chunks,
           shape.width, shape.replicas, shape.pipelines)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    programs = flush_arrays(name, shape)
    found = None if programs is None else (programs, compile_arrays(programs),
                                           _producers(programs))
    _CACHE[key] = found
    while len(_CACHE) > CACHE_SIZE or (len(_CACHE) > 1 and _kept_actions() > CACHE_ACTIONS):
        _CACHE.popitem(last=False)
    return found


def _kept_actions() -> int:
    return sum(len(graph[0].op) for graph in _CACHE.values() if graph is not None)


def _producers(programs: ArrayPrograms) -> np.ndarray:
    """Each action's producer on another stage (:func:`pipeweave.ir.dependencies`: F waits
    for F on ``s - 1``, B and I for the B or I on ``s + 1``), flat rank-major; -1: none."""
    op, stage, micro = programs.op, programs.stage, programs.microbatch
    count = len(op)
    every = np.arange(count)
    stages = programs.layout.num_stages
    passes = int(micro.max(initial=0)) + 1
    forward = op == OPS.index(Op.FORWARD)
    gradient = (op == OPS.index(Op.BACKWARD)) | (op == OPS.index(Op.BACKWARD_INPUT))
    key = (gradient.astype(np.int64) * stages + stage) * passes + micro
    found = np.full(2 * stages * passes, -1, dtype=np.int64)
    computing = forward | gradient
    found[key[computing]] = every[computing]
    needs = np.where(forward, stage > 0, gradient & (stage < stages - 1))
    producer = np.full(count, -1, dtype=np.int64)
    step = np.where(forward[needs], -1, 1)
    producer[needs] = found[key[needs] + step * passes]
    return producer


def path_arrays(graph: FlushGraph, costs: Costs) -> PathTiming | None:
    """:func:`pipeweave.sim.simulate_path` of ``graph`` (:func:`flush_graph`) under
    ``costs``; None with ranks sharing cores (another walk, :mod:`pipeweave.sim.shared_cores`)."""
    programs, compiled, producer = graph
    table = costs.resolve(programs.layout.num_stages)
    if table.shared_cores is not None and table.shared_cores < programs.num_ranks:
        return None
    start, end = compiled.times(table)
    cut = np.cumsum((0,) + programs.lengths).tolist()
    makespan = max((float(end[b - 1]) for a, b in zip(cut[:-1], cut[1:]) if b > a),
                   default=0.0)
    rank = np.repeat(np.arange(programs.num_ranks), programs.lengths)
    compute = np.isin(programs.op, PASSES)
    path = _backtrack(programs, compute, producer, rank, cut, start, end, table)
    load: dict[int, float] = defaultdict(float)
    for node in path:
        if compute[node]:
            load[int(programs.stage[node])] += float(end[node]) - float(start[node])
    master = max(load, key=lambda s: (load[s], s)) if load else 0
    return PathTiming(makespan / programs.iterations, master)


def _last_compute(compute: np.ndarray, stage: np.ndarray, cut: list[int],
                  end: np.ndarray) -> int | None:
    """:func:`pipeweave.sim.critical_path._last_compute` on the columns."""
    best: tuple[float, int] | None = None
    last = None
    for a, b in zip(cut[:-1], cut[1:]):
        hits = np.flatnonzero(compute[a:b])
        if len(hits) == 0:
            continue
        node = a + int(hits[-1])
        key = (float(end[node]), -int(stage[node]))
        if best is None or key > best:
            last, best = node, key
    return last


def _backtrack(programs: ArrayPrograms, compute: np.ndarray, producer: np.ndarray,
               rank: np.ndarray, cut: list[int], start: np.ndarray, end: np.ndarray,
               table: StageCosts) -> list[int]:
    """The critical path's actions (flat numbers), first first, by the rules of
    :func:`pipeweave.sim.critical_path.critical_path` (module docstring)."""
    stage = programs.stage
    node = _last_compute(compute, stage, cut, end)
    if node is None:
        return []
    first = set(cut[:-1])
    latency, transfer = table.latency, table.transfer
    delayed = not (latency == 0 and not any(transfer))
    path = [node]
    while True:
        t0 = float(start[node])
        tolerance = 1e-9 * max(1.0, abs(t0))
        candidates: list[tuple[int, int, tuple[int, int]]] = []
        dep = int(producer[node])
        if dep >= 0:
            ready = float(end[dep])
            if rank[dep] != rank[node] and delayed:
                ready += latency + transfer[min(int(stage[dep]), int(stage[node]))]
            if ready >= t0 - tolerance:
                r = int(rank[dep])
                candidates.append((int(stage[dep]), 0, (r, dep - cut[r])))
        if node not in first and float(end[node - 1]) >= t0 - tolerance:
            r = int(rank[node])
            candidates.append((int(stage[node - 1]), 1, (r, node - 1 - cut[r])))
        if not candidates:
            break
        r, position = max(candidates)[2]
        node = cut[r] + position
        path.append(node)
    path.reverse()
    return path
