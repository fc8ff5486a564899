"""ZB-V's and interleaved ZB's orders as columns: the list schedule stepped in numpy.

:func:`~pipeweave.schedules.zbv.zbv_order` and :func:`~pipeweave.schedules.interleaved_zb.
interleaved_zb_order` list-schedule every pass of every rank at unit cost, one step at a time,
one rank after another in Python (``3Mv`` picks per rank: seconds at 128 ranks x 1,024
micro-batches). Here every rank picks at once, a step a numpy pass over the ranks, and
passes repeat where the state does:

* **what a rank starts at step t depends on counters alone**: per rank and chunk, the
  forwards, input gradients and weight gradients started before ``t``. A pass started at
  step ``t'`` has finished by ``t' + 1``, so "finished by ``t``" is "started before ``t``",
  and a chunk's ``F``'s, ``I``'s and ``W``'s each go in micro-batch order (ZB-V's ``W`` heap
  pops the least ``(i, chunk)``, interleaved ZB's queue its ``I``'s in order, each chunk's in
  micro-batch order). So every rank picks from the counters at the step's start (what the
  order functions' times say when ranks pick in turn), and a pass is its counter: its
  micro-batch is how many times its rank advanced that counter before;
* **the rule commutes with a shift**: it compares counters with one another (ZB-V's also
  with ``M``; interleaved ZB's reads its rank's Megatron sequence at the counters' sum). If
  the counters at step ``t2`` are those of an earlier ``t1`` plus ``d`` everywhere, the steps
  ``t1 .. t2`` repeat for as long as the comparisons with ``M`` come out the same (every
  counter below ``M``) and the sequences read at the shifted positions are the same,
  micro-batches ``+ d`` (checked in numpy on the positions the copies read). They are copied
  instead of stepped (found by a dictionary of the counters less one of them; at 128 ranks
  ZB-V's state does not repeat within 2,048 micro-batches, interleaved ZB's does).

The result is the order functions' pass for pass (``tests/schedules/test_copy_orders.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir import Op
from .interleaved_zb import megatron_passes
from .pass_columns import F, I, Rows, W, interleaved_rows

__all__ = ["zbv_rows", "interleaved_zb_rows"]

Step = Callable[[np.ndarray], np.ndarray]
"""``step(counts)``: each rank's counter advanced this step (-1: idle), ``counts`` (ranks x
counters) updated in place."""
Copies = Callable[[np.ndarray, np.ndarray, int], int]
"""``copies(before, now, d)``: how many times the steps from ``before`` to ``now`` (counters
``+ d``) may be copied on (0: none)."""


def _run(counts: np.ndarray, total: int, step: Step, copies: Copies,
         modulus: int = 1) -> np.ndarray:
    """Each step's counter per rank (steps x ranks, -1: idle) until ``total`` passes ran; the
    first repeated state (every counter ``+ d``, ``d`` a multiple of ``modulus``) that
    ``copies`` allows to copy is copied that many times (module docstring); a repeat it
    refuses becomes the state later ones are measured from."""
    steps: list[np.ndarray] = []
    seen: dict[bytes, tuple[int, int, np.ndarray]] | None = {}
    while total > 0:
        if seen is not None:
            reference = int(counts[0, 0])
            key = np.append(counts - reference, reference % modulus).tobytes()
            hit = seen.get(key)
            shift = 0 if hit is None else reference - hit[1]
            times = 0 if hit is None else copies(hit[2], counts, shift)
            if hit is not None and times > 0:
                segment = steps[hit[0]:]
                total -= times * sum(int(np.count_nonzero(s >= 0)) for s in segment)
                steps += segment * times
                counts += times * shift
                seen = None  # the drain is left to the rule
            else:
                seen[key] = (len(steps), reference, counts.copy())
        chosen = step(counts)
        steps.append(chosen)
        started = int(np.count_nonzero(chosen >= 0))
        assert started, "a list-scheduled order never stalls (its order function says why)"
        total -= started
    return np.stack(steps)


def _rows(chosen: np.ndarray, ops: list[int], stage: Callable[[int, int], int]) -> tuple[Rows, ...]:
    """Each rank's passes from the counters it advanced: counter ``k`` is op ``ops[k]`` on
    ``stage(rank, k)``, its micro-batch the times the rank advanced ``k`` before."""
    out = []
    for rank in range(chosen.shape[1]):
        column = chosen[:, rank]
        column = column[column >= 0].astype(np.int64)
        micro = np.zeros(len(column), dtype=np.int64)
        for k in range(len(ops)):
            mine = column == k
            micro[mine] = np.arange(int(mine.sum()))
        stages = np.array([stage(rank, k) for k in range(len(ops))], dtype=np.int64)
        out.append((np.asarray(ops, dtype=np.int64)[column], stages[column], micro))
    return tuple(out)


def _pick(options: list[np.ndarray]) -> np.ndarray:
    """Per rank, the first of ``options`` (masks in priority order) that holds, or -1."""
    chosen = np.full(len(options[0]), -1, dtype=np.int64)
    for k in reversed(range(len(options))):
        chosen[options[k]] = k
    return chosen


def zbv_rows(P: int, M: int) -> tuple[Rows, ...]:
    """:func:`~pipeweave.schedules.zbv.zbv_order` as columns (module docstring). Counters
    per rank: ``F`` of chunk 1, ``I`` of chunk 1, ``F`` and ``I`` of chunk 0 (the rule's
    priority), ``W`` of chunk 0 and of chunk 1."""
    counts = np.zeros((P, 6), dtype=np.int64)
    cap, ranks = 2 * P, np.arange(P)
    never = np.array([M + 1])

    def step(c: np.ndarray) -> np.ndarray:
        f1, i1, f0, i0, w0, w1 = c.T
        held = f0 + f1 - w0 - w1
        options = [(f1 < M) & (held < cap) & (np.concatenate((f1[1:], f0[-1:])) > f1),
                   (i1 < M) & (f1 > i1) & (np.concatenate((never, i1[:-1])) > i1),
                   (f0 < M) & (held < cap - 1) & (np.concatenate((never, f0[:-1])) > f0),
                   (i0 < M) & (f0 > i0) & (np.concatenate((i0[1:], i1[-1:])) > i0),
                   (w0 < i0) & ((w1 >= i1) | (w0 <= w1)),  # the heap's least (i, chunk)
                   w1 < i1]
        chosen = _pick(options)
        moved = chosen >= 0
        c[ranks[moved], chosen[moved]] += 1
        return chosen

    def copies(before: np.ndarray, now: np.ndarray, shift: int) -> int:
        return (M - 1 - int(now.max())) // shift  # every counter stays below M

    chosen = _run(counts, 6 * M * P, step, copies)
    last = 2 * P - 1
    return _rows(chosen, [F, I, F, I, W, W],
                 lambda rank, k: rank if k in (2, 3, 4) else last - rank)


def interleaved_zb_rows(P: int, M: int, v: int) -> tuple[Rows, ...]:
    """:func:`~pipeweave.schedules.interleaved_zb.interleaved_zb_order` as columns (module
    docstring). Counters per rank: ``F``, ``I`` and ``W`` of each chunk; a rank's next
    ``F``/``I`` is its Megatron sequence at the sum of its ``F`` and ``I`` counters, its next
    ``W`` that of the oldest ``I`` whose ``W`` has not run."""
    code, stage, micro = (np.stack(c) for c in zip(*(_sequence(P, v, M, r) for r in range(P))))
    grads = code == I
    owed = (stage[grads].reshape(P, -1), micro[grads].reshape(P, -1))
    cap = int(np.cumsum(np.where(code == F, 1, -1), axis=1).max(initial=0))
    counts = np.zeros((P, 3 * v), dtype=np.int64)
    ranks, last, length = np.arange(P), P * v - 1, code.shape[1]

    def step(c: np.ndarray) -> np.ndarray:
        forwards, inputs = c[:, :v], c[:, v:2 * v]
        position = forwards.sum(1) + inputs.sum(1)
        waited = c[:, 2 * v:].sum(1)
        at = np.minimum(position, length - 1)
        op, s, i = code[ranks, at], stage[ranks, at], micro[ranks, at]
        live = position < length
        before, after = s - 1, s + 1
        f_ok = live & (op == F) & (forwards.sum(1) - waited < cap) & (
            (s == 0) | (forwards[before % P, before // P] > i))
        i_ok = live & (op == I) & (forwards[ranks, s // P] > i) & (
            (s == last) | (inputs[after % P, np.minimum(after // P, v - 1)] > i))
        w_stage = owed[0][ranks, np.minimum(waited, owed[0].shape[1] - 1)]
        chosen = np.where(f_ok, s // P, np.where(
            i_ok, v + s // P, np.where(waited < inputs.sum(1), 2 * v + w_stage // P, -1)))
        moved = chosen >= 0
        c[ranks[moved], chosen[moved]] += 1
        return chosen

    def copies(before: np.ndarray, now: np.ndarray, shift: int) -> int:
        at = (before[:, :2 * v].sum(1), now[:, :2 * v].sum(1))
        waited = (before[:, 2 * v:].sum(1), now[:, 2 * v:].sum(1))
        return min(min(_room((code[r], stage[r], micro[r]), int(at[0][r]), int(at[1][r]),
                             shift),
                       _room((owed[0][r], owed[1][r]), int(waited[0][r]), int(waited[1][r]),
                             shift)) for r in range(P))

    chosen = _run(counts, 3 * M * v * P, step, copies, modulus=P)
    return _rows(chosen, [F] * v + [I] * v + [W] * v, lambda rank, k: (k % v) * P + rank)


def _sequence(P: int, v: int, M: int, rank: int) -> Rows:
    """:func:`~pipeweave.schedules.interleaved_zb.megatron_passes` of ``rank`` as columns."""
    if v == 1:
        passes = megatron_passes(rank, P, 1, M)
        return (np.array([F if p[0] is Op.FORWARD else I for p in passes], dtype=np.int64),
                np.array([p[1] for p in passes], dtype=np.int64),
                np.array([p[2] for p in passes], dtype=np.int64))
    op, stage, micro = interleaved_rows(P, v, M, rank)
    return np.where(op == F, F, I), stage, micro


def _room(rows: tuple[np.ndarray, ...], start: int, end: int, shift: int) -> int:
    """How many times the reads at positions ``start .. end`` of ``rows`` may be copied
    ``s = end - start`` further on, the last column (micro-batches) ``+ shift`` each time:
    the largest ``K`` with ``rows[p + s] == rows[p]`` so for ``p`` in ``start .. end + s(K-1)``."""
    step = end - start
    length = len(rows[0])
    if step <= 0 or end + step >= length:
        return 0
    same = np.ones(length - step, dtype=bool)
    for column, add in zip(rows, (0,) * (len(rows) - 1) + (shift,)):
        same &= column[step:] == column[:-step] + add
    broken = np.flatnonzero(~same[start:])
    first = start + (int(broken[0]) if len(broken) else length - step)
    return max(0, (first - 1 - end) // step + 1)
