"""PipeDream's pruned dynamic program gives exactly what the full enumeration gave.

``data/pipedream_golden.json`` holds the answers of the implementation that tried every
``(s, m')`` of every cell (commit 0ed430b, before branch and bound): on random chains, the
PipeDream reference profiles, GPT-like profiles at sub-layer granularity and the synthetic
200-block profile of ``benchmarks/auto_scale.py``, on one to three levels, straight or not,
overlapped all-reduce or not, with and without a memory limit. Every field must be equal —
bounds, replicas, the time per minibatch to the last bit, and which of several equally fast
pipelines is chosen (ties).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeweave.planner import Topology, pipedream_partition

DATA = json.loads((Path(__file__).parent / "data" / "pipedream_golden.json").read_text())


def solve(case: dict[str, Any]) -> dict[str, Any]:
    arrays = DATA["profiles"][case["profile"]]
    options = {k: case[k] for k in ("straight", "allreduce_overlap", "memory_limit") if k in case}
    try:
        s = pipedream_partition(
            arrays["compute"], arrays["parameter_bytes"], arrays["output_bytes"],
            Topology.parse(case["topology"]), activation_bytes=arrays["activation_bytes"],
            optimizer_bytes=arrays["optimizer_bytes"], **options)
    except ValueError as error:
        return {"error": str(error)}
    answer = {"bounds": s.bounds, "replicas": s.replicas, "time": s.time_per_minibatch,
              "stage_times": s.stage_times, "top_level": s.top_level,
              "boundary_levels": s.boundary_levels, "replica_levels": s.replica_levels,
              "noam": s.noam}
    result: dict[str, Any] = json.loads(json.dumps(answer))
    return result


@pytest.mark.parametrize("chunk", range(8))
def test_same_answers_as_the_full_enumeration(chunk: int) -> None:
    cases = DATA["cases"][chunk::8]
    wrong = [(c["profile"], c["topology"], c["result"], got)
             for c in cases if (got := solve(c)) != c["result"]]
    assert not wrong, wrong[:3]


def test_the_data_covers_what_matters() -> None:
    cases = DATA["cases"]
    assert len(cases) > 300
    assert any(len(c["topology"].split(",")) == 3 for c in cases)
    assert any("memory_limit" in c and "error" not in c["result"] for c in cases)
    assert any(c.get("straight") for c in cases)
    assert any(c.get("allreduce_overlap") is False for c in cases)
    assert any(max(c["result"].get("replicas", [1])) > 1 for c in cases)
    assert any("error" in c["result"] for c in cases)
