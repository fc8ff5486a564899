"""benchmarks/avgpipe_tuner.py runs end to end on a tiny grid of real runs."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_tuner_benchmark_compares_the_pick_with_real_runs(tmp_path: Path) -> None:
    out = tmp_path / "tuner.json"
    run_benchmark(
        "avgpipe_tuner.py", "--models", "cnn", "--ranks", "2", "--m-grid", "2", "4",
        "--n-grid", "1", "2", "--iterations", "2", "--quiet-wait", "0", "--json-out", str(out))
    report = json.loads(out.read_text())
    (case,) = report["cases"]
    assert report["profile_at"] == [4, 1] and case["profile"]["source"] == "measured"
    assert [(r["M"], r["N"]) for r in case["settings"]] == [(2, 1), (2, 2), (4, 1), (4, 2)]
    # memory is counted, so Equation 8 gives the profiled setting's back exactly
    (profiled,) = [r for r in case["settings"] if (r["M"], r["N"]) == (4, 1)]
    assert profiled["memory_error"] == pytest.approx(0.0, abs=1e-9)
    for entry in case["limits"]:
        assert entry["default"]["ratio"] >= 1.0 and entry["default"]["pick_fits"]
    assert case["cost"]["speedup"] > 0 and case["cost"]["settings"] == 4
