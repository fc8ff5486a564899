"""benchmarks/split_backward_cost.py runs end to end: W with and without the engine per holder."""

import json
from pathlib import Path

import pytest
from script_runner import run_benchmark


@pytest.mark.timeout(300)
def test_split_backward_cost_counts_fewer_engine_calls_on_the_direct_path(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    completed = run_benchmark("split_backward_cost.py", "--tiny", "--repeats", "1",
                              "--json-out", str(out))
    assert "calls/W" in completed.stdout
    result = json.loads(out.read_text())
    assert all(result[key] > 0 for key in ("B_ms", "I_ms", "W_ms", "W_engine_ms"))
    # 5 sub-layer blocks: 10 linears go around the engine, the 5 LayerNorms through it
    assert result["engine_calls_per_W_engine"] == 15
    assert result["engine_calls_per_W"] == 5
