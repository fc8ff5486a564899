"""Chrome-trace export of a timeline (open the JSON in Perfetto or chrome://tracing).

It takes plain records ``(rank, action text, start seconds, end seconds)`` so that a simulated
timeline (:attr:`pipeweave.sim.SimulationResult.timeline`) and a timeline measured by the
runtime go through the same function. Each record becomes one complete event (``"ph": "X"``)
in the Trace Event Format::

    {"name": "forward mb 3 · stage 1", "cat": "forward", "ph": "X", "pid": 0, "tid": 1,
     "ts": 4000000.0, "dur": 1000000.0,
     "args": {"action": "1F3@0", "stage": 1, "microbatch": 3, "version": 0}}

Event names are words a reader of the timeline understands (``forward mb 3 · stage 1``,
``send activation mb 3 · stage 1``, ``update stage 0 → v2``; a split backward's halves are
``input gradient`` and ``weight gradient``, both in category ``backward``); the compact
action text, which parses back with :func:`pipeweave.ir.parse_action`, and its fields are in
``args``.

One process (``pid`` 0, named after the schedule) with one thread per rank (``tid`` = rank,
named ``rank r``); timestamps and durations are in microseconds. Simulated timelines in cost
units are exported with ``time_unit=1`` (one unit = one second), so the viewer's ruler reads
in units.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..ir import Action, Op, parse_action

__all__ = ["Record", "chrome_trace", "write_chrome_trace", "readable_name"]

Record = tuple[int, str, float, float]
"""``(rank, action text, start, end)``; start/end in seconds (or simulated cost units)."""

_CATEGORY = {
    Op.FORWARD: "forward", Op.BACKWARD: "backward", Op.BACKWARD_INPUT: "backward",
    Op.BACKWARD_WEIGHT: "backward", Op.SEND_ACT: "send", Op.SEND_GRAD: "send",
    Op.RECV_ACT: "recv", Op.RECV_GRAD: "recv", Op.STEP: "update", Op.ALL_REDUCE: "allreduce",
    Op.AVERAGE: "average", Op.CHECK: "check", Op.VALIDATE: "check",
}


def chrome_trace(
    records: Iterable[Sequence[Any]], *, name: str = "pipeweave", time_unit: float = 1.0
) -> dict[str, Any]:
    """The trace as a JSON-able dict ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    Args:
        records: ``(rank, action text, start, end)`` tuples (e.g. ``TimelineRecord``).
        name: the process name shown in the viewer (e.g. the schedule's name).
        time_unit: seconds per record time unit (1 for seconds and for simulated units).
    """
    if time_unit <= 0:
        raise ValueError(f"time_unit must be > 0 seconds per unit, got {time_unit}")
    scale = 1e6 * time_unit  # to microseconds
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": name}}
    ]
    ranks: set[int] = set()
    for record in records:
        rank_field, text_field, start_field, end_field = record
        rank, text = int(rank_field), str(text_field)
        start, end = float(start_field), float(end_field)
        if end < start:
            raise ValueError(f"record {tuple(record)!r} ends before it starts; give start <= end")
        ranks.add(rank)
        category, label, args = _describe(text)
        events.append({
            "name": label, "cat": category, "ph": "X", "pid": 0, "tid": rank,
            "ts": start * scale, "dur": (end - start) * scale, "args": args,
        })
    for rank in sorted(ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"sort_index": rank}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(
    records: Iterable[Sequence[Any]], path: str | Path, *, name: str = "pipeweave",
    time_unit: float = 1.0,
) -> Path:
    """Write :func:`chrome_trace` to ``path`` (JSON); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(records, name=name, time_unit=time_unit)))
    return path


_WORDS = {
    Op.FORWARD: "forward", Op.BACKWARD: "backward", Op.BACKWARD_INPUT: "input gradient",
    Op.BACKWARD_WEIGHT: "weight gradient", Op.SEND_ACT: "send activation",
    Op.RECV_ACT: "receive activation", Op.SEND_GRAD: "send gradient",
    Op.RECV_GRAD: "receive gradient", Op.STEP: "update", Op.ALL_REDUCE: "all-reduce",
    Op.AVERAGE: "average", Op.CHECK: "gradient check", Op.VALIDATE: "validate update",
}


def readable_name(action: Action) -> str:
    """A reader's name for an action, e.g. ``forward mb 3 · stage 1``."""
    words = _WORDS[action.op]
    if action.microbatch is not None:
        piece = "ab"[action.piece - 1] if action.piece else ""
        words += f" mb {action.microbatch}{piece} · stage {action.stage}"
    else:
        words += f" stage {action.stage}"
        if action.version is not None:
            words += f" → v{action.version}"
    if action.pipeline:
        words += f" · pipeline {action.pipeline}"
    return words


def _describe(text: str) -> tuple[str, str, dict[str, Any]]:
    """Category, readable name and args (the compact text, stage, micro-batch, ...)."""
    try:
        action = parse_action(text)
    except ValueError:  # a measured record with a free-form label
        return "other", text, {}
    args: dict[str, Any] = {"action": text, "stage": action.stage}
    if action.microbatch is not None:
        args["microbatch"] = action.microbatch
    if action.piece:
        args["piece"] = "ab"[action.piece - 1]
    if action.version is not None:
        args["version"] = action.version
    if action.lookahead:
        args["lookahead"] = action.lookahead
    if action.pipeline:
        args["pipeline"] = action.pipeline
    return _CATEGORY[action.op], readable_name(action), args
