"""A rank's journal (runtime/observation/journal.py): frames appended at every step add up to
the rank's result so far, each frame carries only what is new, and a frame cut short by a kill
is ignored."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

from pipeweave.runtime.observation.journal import StepJournal, read_journal
from pipeweave.runtime.observation.results import RankResult


def _frames(path: Path) -> list[RankResult]:
    frames = []
    with open(path, "rb") as handle:
        while True:
            try:
                frames.append(pickle.load(handle))
            except EOFError:
                return frames


def _stage() -> SimpleNamespace:
    """A stage's losses as the journal reads them: without waiting (``LossLog.values``)."""
    losses: dict[int, float] = {}
    return SimpleNamespace(losses=losses, loss_log=SimpleNamespace(
        values=lambda wait=True: losses))


def test_frames_add_up_to_the_latest_result_and_a_torn_frame_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "rank1.journal"
    last, other = _stage(), _stage()  # two stages' losses
    parts = SimpleNamespace(stages={1: last}, pipelines=[SimpleNamespace(stages={1: last}),
                                                         SimpleNamespace(stages={1: other})])
    now = RankResult(rank=1)
    journal = StepJournal(path, lambda state: now, parts, window=2)  # type: ignore[arg-type]
    for step in range(6):  # each step: 2 new losses per pipeline, 3 new records, a new peak
        last.losses.update({2 * step: float(step), 2 * step + 1: step + 0.5})
        other.losses.update({2 * step: -float(step), 2 * step + 1: -step - 0.5})
        now.records.extend((1, f"{step}F{k}", float(k), k + 1.0) for k in range(3))
        now.peak_memory_bytes = 100 * (step + 1)
        journal.write()
    last.losses[11] = 9.0  # a value changed after it was written (a redone micro-batch)
    journal.write()
    journal.close()

    frames = _frames(path)
    assert [sorted(frame.losses) for frame in frames[-2:]] == [[8, 9, 10, 11], [10, 11]]
    assert all(len(frame.records) <= 3 for frame in frames)  # each record written once
    merged = read_journal(path)
    assert merged is not None
    assert merged.losses == last.losses and merged.pipeline_losses == {1: other.losses}
    assert merged.records == now.records and merged.peak_memory_bytes == 600

    whole = path.stat().st_size
    with open(path, "ab") as handle:  # the kill came in the middle of the next frame
        handle.write(b"\x80\x05\x95\x10\x00\x00")
    torn = read_journal(path)
    assert torn is not None and torn.losses == last.losses and path.stat().st_size > whole


def test_an_empty_or_missing_journal_is_none(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert read_journal(tmp_path / "empty") is None
    assert read_journal(tmp_path / "missing") is None


def test_the_model_state_is_walked_at_frames_1_2_4_8_only(tmp_path: Path) -> None:
    """Walking every parameter and optimizer state tensor at every step cost a small model's
    rank several per cent of its step; the state does not change size after the first
    steps, so frames carry the last value measured."""
    asked: list[bool] = []

    def snapshot(state: bool) -> RankResult:
        asked.append(state)
        return RankResult(rank=0, state_bytes=1000 + len(asked) if state else 0)

    parts = SimpleNamespace(stages={}, pipelines=[SimpleNamespace(stages={})])
    journal = StepJournal(tmp_path / "j", snapshot, parts, window=1)  # type: ignore[arg-type]
    for _ in range(100):
        journal.write()
    journal.close()
    assert [i + 1 for i, state in enumerate(asked) if state] == [1, 2, 4, 8, 16, 32, 64]
    frames = _frames(tmp_path / "j")
    assert [f.state_bytes for f in frames[:5]] == [1001, 1002, 1002, 1004, 1004]
    assert frames[-1].state_bytes == 1064  # measured at frame 64, carried to frame 100
    merged = read_journal(tmp_path / "j")
    assert merged is not None and merged.state_bytes == 1064
