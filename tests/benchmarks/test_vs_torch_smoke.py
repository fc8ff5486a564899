"""benchmarks/vs_torch_pipelining.py runs end to end at a tiny size, both sides training."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_benchmark_runs_both_sides_on_the_same_model_and_data(tmp_path: Path) -> None:
    out = tmp_path / "vs.json"
    completed = run_benchmark(
        "vs_torch_pipelining.py", "--cases", "tiny", "--ranks", "2", "--schedules", "1f1b",
        "--steps", "3", "--repeats", "1", "--quiet-wait", "0", "--json-out", str(out))
    assert "samples/s" in completed.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["schedule"], row["ranks"]) == ("1f1b", 2)
    pw, th = row["pipeweave"], row["torch"]
    # Same initial weights and data: the first iteration's loss agrees to float32 rounding,
    # and the loss falls on both sides over three SGD steps.
    assert len(pw["losses"]) == len(th["losses"]) == 3
    assert pw["losses"][0] == pytest.approx(th["losses"][0], rel=1e-5)
    assert pw["losses"][-1] < pw["losses"][0] and th["losses"][-1] < th["losses"][0]
    assert row["both_train"] is True
    for side in (pw, th):
        assert side["samples_per_second"] > 0
        assert len(side["peak_rss_bytes"]) == 2 and min(side["peak_rss_bytes"]) > 50 * 2**20
    assert row["throughput_ratio"] == pytest.approx(
        pw["samples_per_second"] / th["samples_per_second"])
