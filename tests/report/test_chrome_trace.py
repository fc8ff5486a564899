"""Chrome-trace export: one complete event per record, microseconds, args from the action text."""

from __future__ import annotations

import json

import pytest

from pipeweave.report import chrome_trace, write_chrome_trace
from pipeweave.schedules import build_schedule
from pipeweave.sim import simulate


def test_simulated_trace_has_one_event_per_action(tmp_path) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule("1f1b", stages=3, microbatches=4)
    result = simulate(schedule)
    path = write_chrome_trace(result.timeline, tmp_path / "sub" / "trace.json", name="1f1b")
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    compute = [e for e in complete if e["cat"] in ("forward", "backward")]
    assert len(compute) == sum(1 for _, _, a in schedule.actions() if a.is_compute) == 3 * 4 * 2
    assert len(complete) == sum(len(p) for p in schedule.programs)  # plus the 3 updates
    # 1F0 runs from 1 to 2 (cost units exported as seconds -> microseconds)
    event = next(e for e in complete if e["args"].get("action") == "1F0@0")
    assert event["name"] == "forward mb 0 · stage 1"
    assert (event["tid"], event["ts"], event["dur"]) == (1, 1e6, 1e6)
    assert event["args"] == {"action": "1F0@0", "stage": 1, "microbatch": 0, "version": 0}
    assert {e["name"] for e in complete if e["cat"] == "update"} == {
        "update stage 0 → v1", "update stage 1 → v1", "update stage 2 → v1"}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1", "rank 2"}


def test_measured_records_and_free_labels() -> None:
    records = [(0, "0F3a@2~1#1", 0.5, 0.75), (1, "idle", 0.0, 0.1)]
    events = [e for e in chrome_trace(records, time_unit=1e-3)["traceEvents"] if e["ph"] == "X"]
    assert events[0]["args"] == {"action": "0F3a@2~1#1", "stage": 0, "microbatch": 3,
                                 "piece": "a", "version": 2, "lookahead": 1, "pipeline": 1}
    assert events[0]["name"] == "forward mb 3a · stage 0 · pipeline 1"
    assert events[1]["name"] == "idle"
    assert events[0]["ts"] == pytest.approx(500.0) and events[0]["dur"] == pytest.approx(250.0)
    assert events[1]["cat"] == "other" and events[1]["args"] == {}


def test_bad_records_are_rejected() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        chrome_trace([(0, "0F0", 2.0, 1.0)])
    with pytest.raises(ValueError, match="time_unit must be > 0"):
        chrome_trace([], time_unit=0)


@pytest.mark.parametrize(("text", "name"), [
    ("1SF4", "send activation mb 4 · stage 1"), ("2RB5", "receive gradient mb 5 · stage 2"),
    ("0AR@2", "all-reduce stage 0 → v2"), ("3AV@1#1", "average stage 3 → v1 · pipeline 1"),
    ("1B7@3", "backward mb 7 · stage 1"), ("1I7@3", "input gradient mb 7 · stage 1"),
    ("2W0", "weight gradient mb 0 · stage 2"),
])
def test_event_names_are_words(text: str, name: str) -> None:
    (event,) = [e for e in chrome_trace([(0, text, 0.0, 1.0)])["traceEvents"] if e["ph"] == "X"]
    assert event["name"] == name and event["args"]["action"] == text
    if text[1] in "BIW":
        assert event["cat"] == "backward"  # a split backward's halves are backward work too
