"""benchmarks/memory_model.py runs end to end on one schedule: predicted against measured."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_memory_model_benchmark_reports_prediction_and_measurement(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    completed = run_benchmark("memory_model.py", "--schedules", "1f1b", "--steps", "1",
                              "--json-out", str(out))
    assert "predicted MB" in completed.stdout
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["schedule"] == "1f1b" and row["status"] == "ok"
    for rank in row["ranks"]:
        parts = rank["parts"]
        assert rank["predicted"] == pytest.approx(sum(parts.values()))
        assert rank["measured"] > 0 and rank["rss"] > rank["measured"]
        assert rank["error"] == pytest.approx((rank["predicted"] - rank["measured"])
                                              / rank["measured"])
