"""Per-step metrics as JSON Lines and CSV, and as TensorBoard event files when asked."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["write_metrics", "write_tensorboard", "LEADING"]

LEADING = ("step", "loss", "time_s", "samples")
"""Columns that come first, in this order, whichever rows hold them (a resumed run's restored
steps have no ``time_s``: the CSV's columns must not move because of that)."""


def write_metrics(rows: Sequence[Mapping[str, float | int | str]], directory: str | Path,
                  *, stem: str = "metrics") -> tuple[Path, Path]:
    """Write ``rows`` to ``<stem>.jsonl`` and ``<stem>.csv`` in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    jsonl, table = directory / f"{stem}.jsonl", directory / f"{stem}.csv"
    jsonl.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
    seen = list(dict.fromkeys(k for row in rows for k in row))
    fields = [k for k in LEADING if k in seen] + [k for k in seen if k not in LEADING]
    with open(table, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return jsonl, table


def write_tensorboard(rows: Sequence[Mapping[str, float | int | str]],
                      directory: str | Path) -> Path:
    """Every numeric column but ``step`` as a scalar per step (``train/<column>``), plus
    ``train/samples_per_s`` between timed steps, with torch's ``SummaryWriter`` (needs the
    ``tensorboard`` package: ``pip install -e '.[tensorboard]'``)."""
    from torch.utils.tensorboard import SummaryWriter

    directory = Path(directory)
    writer = SummaryWriter(log_dir=str(directory))
    try:
        previous: Mapping[str, float | int | str] | None = None
        for row in rows:
            step = int(row["step"])
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    writer.add_scalar(f"train/{key}", value, step)
            if previous is not None and "time_s" in row and "time_s" in previous:
                elapsed = float(row["time_s"]) - float(previous["time_s"])
                samples = float(row["samples"]) - float(previous["samples"])
                if elapsed > 0:
                    writer.add_scalar("train/samples_per_s", samples / elapsed, step)
            previous = row
    finally:
        writer.close()
    return directory
