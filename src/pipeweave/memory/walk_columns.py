"""The memory model's bytes-weighted walk (:func:`.timeline.peak_moments_of`) on columns.

The walk of :mod:`.timeline` keeps running sums (gradients, held activations) and the messages
in flight over a rank's program, one action at a time. On a
:class:`~.lowered_columns.ColumnTimeline` the same sums are numpy's: a running sum
(``np.cumsum``) adds left to right as the walk does, and every other quantity is the walk's
expression evaluated elementwise in the walk's order, so the moments are the walk's to the
last bit (``tests/test_memory_columns.py``). Per step::

    F          + share x kept     (kept: the input if graphless, else a_s + r_s)
    I          + p_s after it     B / W   - (held + pending) after it
    first B/W after an update     + g_s after it, max(0, g_s - held - pending - rebuilt) in it
    U with gradients              a moment of its own with the reduction, then - g_s

and the peak is the first largest total (the walk keeps a moment only when it is larger).
What a micro-batch holds is summed per micro-batch key, in program order: the structure
(which forward, ``I``, ``B`` or ``W`` a key has, which backward creates the gradients) is
read once per shape (:func:`walk_keys`), the bytes per partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .lowered_columns import B, F, I, U, W, ColumnTimeline
from .timeline import PeakMoment, StageBytes

__all__ = ["WalkKeys", "walk_keys", "graphless_steps", "column_moments"]


@dataclass(frozen=True, eq=False)
class WalkKeys:
    """The walk's structure of a shape: what each step does to which micro-batch's bytes."""

    key: np.ndarray
    """Per step: its micro-batch key (stage and micro-batch; 0 for an update)."""
    second: np.ndarray
    """Per step: a forward that is its key's second (a Slicer half)."""
    has_i: np.ndarray
    """Per key: an ``I`` leaves pending bytes for its ``W``."""
    created: np.ndarray
    """Per step: the first ``B``/``W`` of its stage after an update (creates gradients)."""
    reduces: np.ndarray
    """Per step: an update of a stage holding gradients."""
    levels: tuple[np.ndarray, ...]
    """The holds' two ends (``first`` then ``stop``, hold by hold) split into runs that
    touch each position at most once, in the walk's order of adding."""
    size: int
    """Entries of the padded position axis."""


def walk_keys(t: ColumnTimeline) -> WalkKeys | None:
    """:class:`WalkKeys` of ``t``, or None where a micro-batch's actions are not forwards
    (at most two), then at most one ``I``, then at most one ``B`` or ``W`` (the walk's
    rules would need its dictionaries)."""
    code = t.op
    compute = code != U
    span = int(t.microbatch.max()) + 1 if len(code) else 1
    key = np.where(compute, t.stage * span + t.microbatch, 0)
    keys = int(key.max()) + 1 if len(key) else 1
    index = np.arange(len(code))
    forward, inputs = code == F, code == I
    pops = (code == B) | (code == W)
    counts = [np.bincount(key[m], minlength=keys) for m in (forward, inputs, pops,
                                                            (code == B) | inputs)]
    if counts[0].max(initial=0) > 2 or max(c.max(initial=0) for c in counts[1:]) > 1:
        return None
    last_f = np.full(keys, -1)
    np.maximum.at(last_f, key[forward], index[forward])
    at_i = np.full(keys, np.iinfo(np.int64).max)
    at_i[key[inputs]] = index[inputs]
    if ((last_f[key[inputs]] > index[inputs]).any() or (last_f[key[pops]] > index[pops]).any()
            or (at_i[key[pops]] < np.iinfo(np.int64).max)[at_i[key[pops]] > index[pops]].any()):
        return None
    first_f = np.full(keys, np.iinfo(np.int64).max)
    np.minimum.at(first_f, key[forward], index[forward])
    created, reduces = _gradient_moments(t)
    return WalkKeys(key=key, second=forward & (first_f[key] < index), has_i=counts[1] > 0,
                    created=created, reduces=reduces, levels=_levels(t),
                    size=int(t.lengths.sum()) + len(t.lengths))


def _gradient_moments(t: ColumnTimeline) -> tuple[np.ndarray, np.ndarray]:
    """Per step: a ``B``/``W`` whose stage's previous ``B``/``W``/``U`` is an update or none
    (it creates the gradients), and a ``U`` whose stage's previous one is a ``B``/``W``."""
    code = t.op
    events = np.flatnonzero((code == B) | (code == W) | (code == U))
    order = events[np.lexsort((events, t.stage[events]))]
    step = code[order] == U
    fresh_stage = np.concatenate([[True], t.stage[order][1:] != t.stage[order][:-1]])
    after_update = np.concatenate([[True], step[:-1]]) | fresh_stage
    after_backward = ~np.concatenate([[True], step[:-1]]) & ~fresh_stage
    created = np.zeros(len(code), bool)
    reduces = np.zeros(len(code), bool)
    created[order[~step & after_update]] = True
    reduces[order[step & after_backward]] = True
    return created, reduces


def _levels(t: ColumnTimeline) -> tuple[np.ndarray, ...]:
    """:attr:`WalkKeys.levels`, without the ends on a rank's last, unread slot (where every
    message never proved delivered ends)."""
    first, stop, _, _ = t.holds
    ends = np.stack([first, stop], axis=1).reshape(-1)
    unread = np.zeros(int(t.lengths.sum()) + len(t.lengths), bool)
    unread[np.cumsum(t.lengths + 1) - 1] = True
    read = np.flatnonzero(~unread[ends])
    order = read[np.argsort(ends[read], kind="stable")]
    ranked = ends[order]
    level = np.arange(len(ranked)) - np.searchsorted(ranked, ranked)
    runs = np.argsort(level, kind="stable")  # by level, each in its order of ends
    cut = np.searchsorted(level[runs], np.arange(int(level.max(initial=-1)) + 2))
    return tuple(order[runs[a:b]] for a, b in zip(cut[:-1], cut[1:]))


def graphless_steps(t: ColumnTimeline, keys: WalkKeys, recompute: Sequence[bool],
                    backward: str) -> np.ndarray:
    """Per step: a forward that keeps no graph (:func:`.timeline.graphless_forwards`'s rule
    for forwards on live weights: its stage recomputes, or ``backward == "recompute"`` and
    its backward names a newer version), where a ``B`` or ``I`` of its micro-batch follows."""
    code = t.op
    gradient = (code == B) | (code == I)
    later = np.full(int(keys.key.max()) + 1 if len(code) else 1, np.iinfo(np.int64).min)
    later[keys.key[gradient]] = t.version[gradient]
    has_backward = np.zeros(len(later), bool)
    has_backward[keys.key[gradient]] = True
    redo = np.asarray(recompute, dtype=bool)[t.stage]
    if backward == "recompute":
        redo = redo | (later[keys.key] > t.version)
    return (code == F) & has_backward[keys.key] & redo


def column_moments(t: ColumnTimeline, keys: WalkKeys, stages: Sequence[StageBytes],
                   graphless: np.ndarray) -> list[PeakMoment]:
    """Per rank: :func:`.timeline.peak_moments_of`'s moment, from columns (module docstring)."""
    part = {name: np.array([getattr(c, name) for c in stages], dtype=float)[t.stage]
            for name in ("gradients", "activations", "inputs", "pending", "recorded",
                         "workspace", "reduction")}
    in_flight = _in_flight(t, keys, stages)
    code, cut = t.op, t.step_cut
    held, rebuilt = _held(t, keys, part, graphless)
    key = keys.key
    pending = np.where(keys.has_i[key], part["pending"], 0.0)
    delta = np.where(code == F, _share(t) * _kept(part, graphless), 0.0)
    delta = np.where(code == I, part["pending"], delta)
    pops = (code == B) | (code == W)
    delta = np.where(pops, -(held[key] + pending), delta)
    activations = _running(delta, cut)
    seen = np.where(code == F, activations, _before(activations, cut))
    g = part["gradients"]
    gradients = _running(np.where(keys.created, g, np.where(keys.reduces, -g, 0.0)), cut)
    g_before = _before(gradients, cut)
    fresh = ((g - held[key]) - pending) - rebuilt[key]
    fresh = np.where(keys.created, np.where(fresh > 0.0, fresh, 0.0), 0.0)
    workspace = np.where((code == B) | (code == I), part["workspace"] + rebuilt[key], 0.0)
    g_seen = np.where(keys.reduces, gradients, g_before) + fresh
    total = ((g_seen + seen) + workspace) + in_flight
    update = np.where(keys.reduces, ((g_before + seen) + part["reduction"]) + in_flight, -np.inf)
    general = (g_seen, seen, workspace, in_flight)
    at_update = (g_before, seen, part["reduction"], in_flight)
    return [_peak(update[a:b], total[a:b], [x[a:b] for x in at_update],
                  [x[a:b] for x in general]) for a, b in zip(cut[:-1], cut[1:])]


def _share(t: ColumnTimeline) -> np.ndarray:
    return np.where(t.piece > 0, 0.5, 1.0)


def _kept(part: dict[str, np.ndarray], graphless: np.ndarray) -> np.ndarray:
    return np.where(graphless, part["inputs"], part["activations"] + part["recorded"])


def _held(t: ColumnTimeline, keys: WalkKeys, part: dict[str, np.ndarray],
          graphless: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key: what its forwards hold and what its backward rebuilds, each the sum of its
    forwards' shares in program order (the walk's dictionaries)."""
    forward = t.op == F
    kept = _kept(part, graphless)
    share = _share(t)
    gap = part["activations"] - kept
    added = (share * kept, share * np.where(gap > 0.0, gap, 0.0))
    size = int(keys.key.max()) + 1 if len(keys.key) else 1
    sums = []
    for values in added:
        total = np.zeros(size)
        for second in (False, True):
            mask = forward & (keys.second == second)
            total[keys.key[mask]] = total[keys.key[mask]] + values[mask]
        sums.append(total)
    return sums[0], sums[1]


def _in_flight(t: ColumnTimeline, keys: WalkKeys, stages: Sequence[StageBytes]) -> np.ndarray:
    """Per step: the bytes of messages in flight (:func:`.timeline._in_flight`)."""
    _, _, stage, sized = t.holds
    sent = np.array([c.sent for c in stages], dtype=float)
    received = np.array([c.received for c in stages], dtype=float)
    nbytes = np.where(sized, sent[stage], received[stage])
    first, stop, _, _ = t.holds
    ends = np.stack([first, stop], axis=1).reshape(-1)
    values = np.stack([nbytes, -nbytes], axis=1).reshape(-1)
    changes = np.zeros(keys.size)
    for run in keys.levels:  # each run touches a position once: the walk's order of adding
        changes[ends[run]] = changes[ends[run]] + values[run]
    starts = np.concatenate([[0], np.cumsum(t.lengths + 1)])
    alive = np.empty(keys.size)
    for a, n in zip(starts[:-1], t.lengths):
        alive[a:a + n] = np.cumsum(changes[a:a + n])
    return alive[t.position]


def _running(values: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """Each rank's running sum, from 0.0 (the walk's ``+=``, left to right)."""
    out = np.empty(len(values))
    for a, b in zip(cut[:-1], cut[1:]):
        out[a:b] = np.cumsum(values[a:b])
    return out


def _before(values: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``values`` one step earlier within each rank (0.0 at a rank's first step)."""
    out = np.concatenate([[0.0], values[:-1]])
    out[cut[:-1][cut[:-1] < len(values)]] = 0.0
    return out


def _peak(update: np.ndarray, total: np.ndarray, at_update: list[np.ndarray],
          general: list[np.ndarray]) -> PeakMoment:
    """The first largest of the rank's moments (an update's before its step's own), if
    above zero, else nothing held (the walk's ``total > best_total`` from 0.0)."""
    if not len(total):
        return PeakMoment(0.0, 0.0, 0.0, 0.0)
    both = np.stack([update, total], axis=1).reshape(-1)
    best = int(np.argmax(both))
    if not both[best] > 0.0:
        return PeakMoment(0.0, 0.0, 0.0, 0.0)
    parts = at_update if best % 2 == 0 else general
    return PeakMoment(*(float(x[best // 2]) for x in parts))
