"""Per-step metrics as JSON Lines and CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["write_metrics"]


def write_metrics(rows: Sequence[Mapping[str, float | int | str]], directory: str | Path,
                  *, stem: str = "metrics") -> tuple[Path, Path]:
    """Write ``rows`` to ``<stem>.jsonl`` and ``<stem>.csv`` in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    jsonl, table = directory / f"{stem}.jsonl", directory / f"{stem}.csv"
    jsonl.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(table, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return jsonl, table
