"""A flush schedule's lowered programs, as the memory model reads them, from numpy columns.

:func:`.timeline.analyse_programs` reads three things off a lowered schedule (sends and
receives inserted, :func:`pipeweave.ir.lower`), per rank: its length, the messages in flight
as position intervals (:attr:`.timeline.RankTimeline.holds`, from the delivery proofs of
:mod:`pipeweave.ir.deliveries`) and its compute and step actions with their positions. At
planning scale that is millions of actions built, lowered and proved one by one (8-12 s a
shape). Here the same numbers come from the compute-only columns
(:mod:`pipeweave.schedules.flush_arrays`), with the same rules in numpy::

    receive before a compute action     F(s) whose F(s-1) runs on another rank (RF), B/I(s)
                                        whose B(s+1) does (RB)
    send after it                       F(s) whose F(s+1) runs elsewhere (SF), B/I(s) whose
                                        B/I(s-1) does (SB)
    I directly followed by its own W    one B (nothing sent between them)
    a receive's buffer                  from the receive PREFETCH receives earlier (+1) to its
                                        consumer, the action right after it
    a sent gradient                     until the first receive from its destination sent
                                        after the destination received it (the proof)

Only what the rules cover is taken: one rank per stage, one pipeline, every action of a
micro-batch on one rank and in order (forwards, then an ``I``, then one ``B`` or ``W``),
no compute action after an update of its stage; else :func:`lower_columns` says None and
the caller lowers the actions. ``tests/test_memory_columns.py`` compares every number with
:func:`.timeline.analyse_programs` on a grid of schedules, stages, chunks and micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ir import Op
from .timeline import PREFETCH

__all__ = ["ColumnTimeline", "lower_columns", "F", "B", "I", "W", "U"]

F, B, I, W, U, AR, AV = range(7)
"""The op codes of :class:`ColumnTimeline` (compute, update, then what the walk skips)."""
_CODES = {Op.FORWARD: F, Op.BACKWARD: B, Op.BACKWARD_INPUT: I, Op.BACKWARD_WEIGHT: W,
          Op.STEP: U, Op.ALL_REDUCE: AR, Op.AVERAGE: AV}


@dataclass(frozen=True, eq=False)
class ColumnTimeline:
    """Every rank's :class:`.timeline.RankTimeline`, as columns (rank-major)."""

    lengths: np.ndarray
    """Actions per rank's lowered program."""
    step_cut: np.ndarray
    """Rank ``r``'s steps are ``step_cut[r]:step_cut[r + 1]``."""
    op: np.ndarray
    """Per step (compute action or update, in program order): its code (:data:`F` ...)."""
    stage: np.ndarray
    microbatch: np.ndarray
    piece: np.ndarray
    version: np.ndarray
    position: np.ndarray
    """Per step: its position in the lowered program, plus its rank's offset: the index in
    the ranks' programs laid end to end, each one slot longer than its program."""
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """Messages in flight, in the order :func:`.timeline._holds` lists them (rank by rank,
    receives then sent gradients): first, stop (global indices as ``position``), stage,
    sized as sent."""
    split: frozenset[int]
    """Stages whose backward stays split into ``I`` and ``W``."""
    averages: bool
    """Whether an ``AV`` (AvgPipe's averaging) runs."""
    present: frozenset[int]
    """Stages with a compute action or an update (their weight copies: none, a flush)."""


def lower_columns(ops: Sequence[Op], op: np.ndarray, stage: np.ndarray, microbatch: np.ndarray,
                  piece: np.ndarray, version: np.ndarray, lengths: Sequence[int],
                  stage_rank: Sequence[int]) -> ColumnTimeline | None:
    """The memory model's view of the lowered programs whose compute-only columns are given
    (``ops[code]`` the op of a code; ``stage_rank[s]``: the rank of stage ``s``), or None
    where the rules above do not cover them (module docstring)."""
    table = np.full(len(ops), -1, dtype=np.int64)
    for i, o in enumerate(ops):
        table[i] = _CODES.get(o, -1)
    code = table[op]
    if (code < 0).any():
        return None
    rank = np.repeat(np.arange(len(lengths)), lengths)
    where = np.asarray(stage_rank, dtype=np.int64)
    if not _flush(code, stage, len(where)):
        return None
    code, stage, microbatch, piece, version, rank = _merged(
        code, stage, microbatch, piece, version, rank, where)
    recv, send = _messages(code, stage, rank, where)
    width = 1 + recv.astype(np.int64) + send
    ends = np.cumsum(width)
    lowered = np.bincount(rank, weights=width, minlength=len(lengths)).astype(np.int64)
    position = ends - width + recv  # global: the ranks' programs end to end
    offsets = np.concatenate([[0], np.cumsum(lowered)])
    if (recv & (code != F) & (piece != 0)).any():
        return None  # a received gradient waits for a whole backward (ir.deps)
    holds = _holds(code, stage, microbatch, piece, rank, recv, send, position, offsets)
    if holds is None:
        return None
    steps = code <= U
    cut = np.concatenate([[0], np.cumsum(np.bincount(rank[steps], minlength=len(lengths)))])
    # each rank one slot longer (its difference array's last entry), so a hold that ends
    # with its rank's program does not reach into the next rank's
    return ColumnTimeline(lengths=lowered, step_cut=cut, op=code[steps], stage=stage[steps],
                          microbatch=microbatch[steps], piece=piece[steps],
                          version=version[steps], position=position[steps] + rank[steps],
                          holds=holds,
                          split=_stages(stage[code == I], len(where)),
                          averages=bool((code == AV).any()),
                          present=_stages(stage[steps], len(where)))


def _stages(stage: np.ndarray, stages: int) -> frozenset[int]:
    return frozenset(np.flatnonzero(np.bincount(stage, minlength=stages)).tolist())


def _flush(code: np.ndarray, stage: np.ndarray, stages: int) -> bool:
    """No compute action follows an update of its stage (one iteration of a flush; the
    weight copies are then none, :func:`pipeweave.memory.weight_copies`)."""
    index = np.arange(len(code))
    first = np.full(stages, len(code))
    updates = code == U
    np.minimum.at(first, stage[updates], index[updates])
    compute = code < U
    return not (index[compute] > first[stage[compute]]).any()


def _messages(code: np.ndarray, stage: np.ndarray, rank: np.ndarray, where: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per action: whether a receive goes before it and a send after it (module docstring)."""
    last = len(where) - 1
    forward = code == F
    gradient = (code == B) | (code == I)
    before = np.clip(stage - 1, 0, last)
    after = np.clip(stage + 1, 0, last)
    recv = ((forward & (stage > 0) & (where[before] != rank))
            | (gradient & (stage < last) & (where[after] != rank)))
    send = ((forward & (stage < last) & (where[after] != rank))
            | (gradient & (stage > 0) & (where[before] != rank)))
    return recv, send


def _merged(code: np.ndarray, stage: np.ndarray, microbatch: np.ndarray, piece: np.ndarray,
            version: np.ndarray, rank: np.ndarray, where: np.ndarray
            ) -> tuple[np.ndarray, ...]:
    """The columns with every ``I`` directly followed by its own ``W`` (nothing sent
    between them) as one ``B`` (:func:`pipeweave.ir.lower.merge_backward`)."""
    _, send = _messages(code, stage, rank, where)
    same = ((code[:-1] == I) & (code[1:] == W) & ~send[:-1] & (rank[:-1] == rank[1:])
            & (stage[:-1] == stage[1:]) & (microbatch[:-1] == microbatch[1:])
            & (piece[:-1] == piece[1:]))
    if not same.any():
        return code, stage, microbatch, piece, version, rank
    code = code.copy()
    code[:-1][same] = B
    keep = np.concatenate([[True], ~same])
    return tuple(c[keep] for c in (code, stage, microbatch, piece, version, rank))


def _holds(code: np.ndarray, stage: np.ndarray, microbatch: np.ndarray, piece: np.ndarray,
           rank: np.ndarray, recv: np.ndarray, send: np.ndarray, position: np.ndarray,
           offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """:attr:`ColumnTimeline.holds` (module docstring); None if a receive has no send."""
    gradient = code != F
    span = int(microbatch.max()) + 1 if len(microbatch) else 1
    # a message: (gradient?, sending stage, micro-batch, piece); received from the stage
    # before (an activation) or after (a gradient)
    got = np.flatnonzero(recv)
    got_key = _message_key(gradient[got], np.where(gradient[got], stage[got] + 1,
                                                   stage[got] - 1),
                           microbatch[got], np.where(gradient[got], 0, piece[got]), span)
    out = np.flatnonzero(send)
    out_key = _message_key(gradient[out], stage[out], microbatch[out],
                           np.where(gradient[out], 0, piece[out]), span)
    order = np.argsort(out_key, kind="stable")
    found = np.searchsorted(out_key, got_key, sorter=order).clip(0, max(len(out) - 1, 0))
    if len(got) and (len(out) == 0 or (out_key[order[found]] != got_key).any()):
        return None
    sender = order[found]  # per receive: index into out
    if len(out) and (np.bincount(sender, minlength=len(out)) != 1).any():
        return None  # a send nobody receives (the delivery proofs would fail on it)
    end = offsets[rank + 1] - 1  # per action: the last position of its rank
    received = _receive_holds(got, position, gradient, rank, end, offsets)
    released = _released(out, got, sender, rank, position)
    grads = out[gradient[out]]
    stop = np.minimum(released[gradient[out]], end[grads]) + 1
    first = np.concatenate([received[0], position[grads] + 1])
    last = np.concatenate([received[1], stop])
    where = np.concatenate([stage[got], stage[grads]])
    sized = np.concatenate([gradient[got], np.zeros(len(grads), bool)])
    # rank by rank: a rank's receives, then its sent gradients
    owner = np.concatenate([rank[got], rank[grads]])
    by_rank = np.argsort(owner, kind="stable")
    owner = owner[by_rank]  # padded as ColumnTimeline.position
    return (first[by_rank] + owner, last[by_rank] + owner, where[by_rank], sized[by_rank])


def _message_key(gradient: np.ndarray, stage: np.ndarray, microbatch: np.ndarray,
                 piece: np.ndarray, span: int) -> np.ndarray:
    return ((gradient.astype(np.int64) * (1 << 20) + stage) * span + microbatch) * 3 + piece


def _receive_holds(got: np.ndarray, position: np.ndarray, gradient: np.ndarray,
                   rank: np.ndarray, end: np.ndarray, offsets: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per receive (the one right before action ``got[i]``): first and stop of its buffer."""
    at = position[got] - 1
    owner = rank[got]
    index = np.arange(len(got)) - np.searchsorted(owner, owner)  # among its rank's receives
    earlier = np.concatenate([np.zeros(PREFETCH, np.int64), at[:-PREFETCH] + 1]) \
        if len(got) > PREFETCH else np.zeros(len(got), np.int64)
    posted = np.where(index >= PREFETCH, earlier[:len(got)], offsets[owner])
    # a forward's input becomes its activation; a backward's gradient lives while it runs
    last = np.where(gradient[got], at + 1, at)
    return np.minimum(posted, at), np.minimum(last, end[got]) + 1


def _released(out: np.ndarray, got: np.ndarray, sender: np.ndarray, rank: np.ndarray,
              position: np.ndarray) -> np.ndarray:
    """Per send (``out``): the position of the receive that proves it delivered
    (:func:`pipeweave.ir.deliveries.delivery_proofs`), or a position past its rank's end.

    A send ``k`` from ``r`` to ``d`` is proved by ``r``'s first receive from ``d`` whose
    message ``d`` sent after receiving ``k``: the first whose running maximum of sent
    positions exceeds ``k``'s received position."""
    ranks = int(rank.max()) + 1 if len(rank) else 1
    received_at = np.empty(len(out), np.int64)
    received_at[sender] = position[got] - 1
    sent_at = position[out[sender]] + 1  # per receive: where its message was sent
    source = rank[out[sender]]
    pair = rank[got] * ranks + source  # (receiving rank, its source), receives in order
    big = int(position.max()) + 2 if len(position) else 2
    order = np.lexsort((np.arange(len(got)), pair))
    running = np.maximum.accumulate(pair[order] * big + sent_at[order])
    target = np.empty(len(out), np.int64)
    target_pair = rank[out] * ranks + _destination(out, sender, got, rank)
    target[:] = target_pair * big + received_at
    hit = np.searchsorted(running, target, side="right")
    found = hit < len(got)
    same = np.zeros(len(out), bool)
    same[found] = pair[order[hit[found]]] == target_pair[found]
    released = np.full(len(out), np.iinfo(np.int64).max // 4)
    released[same] = position[got[order[hit[same]]]] - 1
    return released


def _destination(out: np.ndarray, sender: np.ndarray, got: np.ndarray,
                 rank: np.ndarray) -> np.ndarray:
    """Per send: the rank that receives it."""
    dest = np.full(len(out), -1, np.int64)
    dest[sender] = rank[got]
    return dest
