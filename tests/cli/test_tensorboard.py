"""``train --tensorboard`` writes event files TensorBoard reads back (issue 13, item 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main

pytest.importorskip("tensorboard")


def test_tensorboard_events_hold_the_losses_of_every_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["train", "--model", "mlp", "--batch-size", "16", "--no-progress", "--steps",
                 "3", "--executor", "local", "--tensorboard", "--output-dir", str(tmp_path)]) == 0
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s for s, _ in losses] == [1, 2, 3]
    assert [v for _, v in losses] == pytest.approx(summary["losses"], rel=1e-6)
    assert len(events.Scalars("train/samples_per_s")) == 2
