"""On a GPU the timeline is device time (issue 25): actions are marked with CUDA events and
placed on the wall-clock axis by one reference event; nothing waits while the run goes on.
Checked on the CPU with a stand-in event class driven by a fake device clock."""

from __future__ import annotations

import pytest
import torch

from pipeweave.runtime.observation import timeline
from pipeweave.runtime.observation.timeline import Recorder


class FakeEvent:
    clock = 0.0  # the fake device's time, seconds
    done_until = 0.0  # events up to this time have run
    waited = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeEvent.clock

    def elapsed_time(self, other: "FakeEvent") -> float:
        assert self.at is not None and other.at is not None
        return 1e3 * (other.at - self.at)

    def synchronize(self) -> None:
        FakeEvent.waited += 1

    def query(self) -> bool:
        assert self.at is not None
        return self.at <= FakeEvent.done_until


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeEvent.clock, FakeEvent.waited, FakeEvent.done_until = 0.0, 0, 0.0
    monkeypatch.setattr(timeline.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timeline.torch.cuda, "synchronize", lambda device=None: None)


def test_actions_are_timed_on_the_device(fake_cuda: None) -> None:
    recorder = Recorder(0, origin=0.0, device=torch.device("cuda", 0))
    at = recorder._reference[1]  # type: ignore[index]
    FakeEvent.clock = 1.0
    start = recorder.mark()
    FakeEvent.clock = 1.25
    recorder.add("0F0", start, recorder.mark())
    FakeEvent.clock = 2.0
    start = recorder.mark()
    FakeEvent.clock = 2.5
    recorder.add("0B0", start, recorder.mark())
    assert FakeEvent.waited == 0  # nothing waited while the run went on
    records = recorder.records
    assert FakeEvent.waited == 1  # reading them waits once, for the last
    assert [(text, round(s - at, 6), round(e - at, 6)) for _, text, s, e in records] == [
        ("0F0", 1.0, 1.25), ("0B0", 2.0, 2.5)]
    assert recorder.records == records  # read once, kept


def test_on_the_cpu_marks_are_host_seconds() -> None:
    recorder = Recorder(3, origin=0.0)
    start = recorder.mark()
    assert isinstance(start, float)
    recorder.add("1F0", start, recorder.mark())
    (rank, text, s, e), = recorder.records
    assert (rank, text) == (3, "1F0") and s <= e


def test_a_long_run_turns_finished_events_into_records_without_waiting(
        fake_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "QUEUED", 4)
    recorder = Recorder(0, origin=0.0, device=torch.device("cuda", 0))
    for step in range(6):
        FakeEvent.clock = float(step)
        start = recorder.mark()
        FakeEvent.clock = step + 0.5
        recorder.add(f"0F{step}", start, recorder.mark())
        FakeEvent.done_until = step - 1.0  # the device runs two actions behind the host
    assert FakeEvent.waited == 0
    assert len(recorder._done) == 3 and len(recorder._queued) == 3  # 0F0..0F2 ran
    assert [text for _, text, _, _ in recorder.records] == [f"0F{k}" for k in range(6)]
