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
        "pipeoptim-graph", "pipedream", "one-process", "--steps", "3", "--repeats", "1", "--quiet-wait", "0",
        "--json-out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    methods = row["methods"]
    assert list(methods) == ["torch-1f1b", "1f1b", "pipeoptim-graph", "pipedream", "one-process"]
    assert methods["torch-1f1b"]["vs_torch_1f1b"] == 1.0
    # Synchronous 1F1B computes what torch's Schedule1F1B computes: same first and last loss.
    assert methods["1f1b"]["first_loss"] == pytest.approx(methods["torch-1f1b"]["first_loss"], rel=1e-5)
    assert methods["1f1b"]["final_loss"] == pytest.approx(methods["torch-1f1b"]["final_loss"], rel=1e-4)
    for name in ("1f1b", "pipeoptim-graph", "pipedream"):
        m = methods[name]
        assert m["samples_per_second"] > 0 and 0 < m["efficiency"] <= 1
        assert m["vs_torch_1f1b"] == pytest.approx(
            m["samples_per_second"] / methods["torch-1f1b"]["samples_per_second"])
        assert m["final_loss"] < m["first_loss"]
        assert m["F_ms"] > 0 and m["B_ms"] > 0 and m["U_ms"] > 0
        assert m["weight_versions"] == m["simulated_weight_versions"]
    # Stashing copies stage 0's weights once per update, the last stage never; replicas are
    # built up to the most copies held at once and reused after that, never per update.
    assert methods["pipedream"]["bytes_copied_per_update"] > 0
    assert methods["1f1b"]["bytes_copied_per_update"] == 0
    for name in ("1f1b", "pipeoptim-graph", "pipedream"):
        assert methods[name]["replicas_built"] == methods[name]["peak_weight_copies"]
    assert methods["pipedream"]["replicas_built"] == 2  # stage 0 of 2: two in-flight versions
    assert methods["pipeoptim-graph"]["weight_versions"][0] == 3
    assert methods["pipeoptim-graph"]["predict_ms"] > 0
    # The same model trained in one process computes the same first loss.
    assert methods["one-process"]["first_loss"] == pytest.approx(methods["1f1b"]["first_loss"], rel=1e-5)
