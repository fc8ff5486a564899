"""benchmarks/async_throughput.py runs end to end at a tiny size for an async method and torch."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_async_benchmark_reports_every_method_against_torch(tmp_path: Path) -> None:
    out = tmp_path / "async.json"
    run_benchmark(
        "async_throughput.py", "--cases", "tiny", "--ranks", "2", "--methods", "1f1b",
        "pipeoptim-graph", "--steps", "3", "--repeats", "1", "--quiet-wait", "0",
        "--json-out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    methods = row["methods"]
    assert list(methods) == ["torch-1f1b", "1f1b", "pipeoptim-graph"]
    assert methods["torch-1f1b"]["vs_torch_1f1b"] == 1.0
    # Synchronous 1F1B computes what torch's Schedule1F1B computes: same first and last loss.
    assert methods["1f1b"]["first_loss"] == pytest.approx(methods["torch-1f1b"]["first_loss"], rel=1e-5)
    assert methods["1f1b"]["final_loss"] == pytest.approx(methods["torch-1f1b"]["final_loss"], rel=1e-4)
    for name in ("1f1b", "pipeoptim-graph"):
        m = methods[name]
        assert m["samples_per_second"] > 0 and 0 < m["efficiency"] <= 1
        assert m["vs_torch_1f1b"] == pytest.approx(
            m["samples_per_second"] / methods["torch-1f1b"]["samples_per_second"])
        assert m["final_loss"] < m["first_loss"]
