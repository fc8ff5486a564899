"""benchmarks/schedule_columns.py runs end to end: both paths timed, the same iteration time."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.timeout(300)
def test_schedule_columns_reports_both_paths_with_the_same_time(tmp_path: Path) -> None:
    out = tmp_path / "columns.json"
    completed = run_benchmark("schedule_columns.py", "1f1b:8:1:32:2", "zbv:4:2:16:1",
                              "--json-out", str(out))
    assert "same time: True" in completed.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [row["shape"] for row in rows] == ["1f1b:8:1:32:2", "zbv:4:2:16:1"]
    for row in rows:
        assert row["actions"] > 0 and all(v >= 0 for v in row["reference"].values())
        assert row["columns"]["same_time"] is True
