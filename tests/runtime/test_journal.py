"""A rank's journal (runtime/observation/journal.py): frames appended at every step add up to
the rank's result so far, and a frame cut short by a kill is ignored."""

from __future__ import annotations

from pathlib import Path

from pipeweave.runtime.observation.journal import StepJournal, read_journal
from pipeweave.runtime.observation.results import RankResult


def test_frames_add_up_to_the_latest_result_and_a_torn_frame_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "rank1.journal"
    now = RankResult(rank=1)
    journal = StepJournal(path, lambda: now)
    for step in range(3):  # each step: 2 new losses, 3 new records, a new peak
        now.losses.update({2 * step: float(step), 2 * step + 1: step + 0.5})
        now.pipeline_losses.setdefault(1, {})[step] = -float(step)
        now.records.extend((1, f"{step}F{k}", float(k), k + 1.0) for k in range(3))
        now.peak_memory_bytes = 100 * (step + 1)
        journal.write()
    now.losses[5] = 9.0  # a value changed after it was written (a redone micro-batch)
    journal.write()
    journal.close()
    whole = path.stat().st_size
    assert path.read_bytes().count(b"0F0") == 1  # records are written once, not every step

    merged = read_journal(path)
    assert merged is not None
    assert merged.losses == now.losses and merged.pipeline_losses == now.pipeline_losses
    assert merged.records == now.records and merged.peak_memory_bytes == 300

    with open(path, "ab") as handle:  # the kill came in the middle of the next frame
        handle.write(b"\x80\x05\x95\x10\x00\x00")
    torn = read_journal(path)
    assert torn is not None and torn.losses == now.losses and path.stat().st_size > whole


def test_an_empty_or_missing_journal_is_none(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert read_journal(tmp_path / "empty") is None
    assert read_journal(tmp_path / "missing") is None
