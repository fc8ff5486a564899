"""PNG timeline: written from simulated or measured records."""

from __future__ import annotations

import pytest

from pipeweave.report import plot_timeline
from pipeweave.schedules import build_schedule
from pipeweave.sim import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_png_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = simulate(build_schedule("1f1b", stages=3, microbatches=4, iterations=2))
    path = plot_timeline(result.timeline, tmp_path / "plots" / "t.png", title="1f1b")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_measured_records_with_sends_and_free_labels(tmp_path) -> None:  # type: ignore[no-untyped-def]
    records = [(0, "0F0", 0.0, 0.1), (0, "0SF0", 0.1, 0.1), (1, "1RF0", 0.0, 0.1),
               (1, "1F0", 0.1, 0.2), (1, "1B0", 0.2, 0.4), (0, "0B0", 0.4, 0.6),
               (0, "checkpoint", 0.6, 0.7)]
    path = plot_timeline(records, tmp_path / "m.png", time_label="time (s)")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_split_backward_is_drawn(tmp_path) -> None:  # type: ignore[no-untyped-def]
    records = [(0, "0F0", 0.0, 1.0), (1, "1F0", 1.0, 2.0), (1, "1I0", 2.0, 3.0),
               (1, "1W0", 3.0, 4.0), (0, "0I0", 3.0, 4.0), (0, "0W0", 4.0, 5.0)]
    assert plot_timeline(records, tmp_path / "zb.png").read_bytes().startswith(PNG_MAGIC)


def test_no_records_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="no records to plot"):
        plot_timeline([], tmp_path / "x.png")
