"""``pipeweave placement``: the ranked table, its JSON, the traffic from a profile, mistakes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.profiler import BlockProfile, Profile
from planner_fixtures import random_profile

CLUSTER = "4x1.2e10,4x1.25e9"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explicit_traffic_table_marks_the_rule_and_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "placement", "--topology", CLUSTER, "--depth", "4",
                       "--p2p-bytes", "1e7", "--allreduce-bytes", "1e9")
    assert code == 0
    lines = out.splitlines()
    assert lines[2].split()[:2] == ["1", "data-inner"] and "WPipe's rule" in lines[2]
    assert "runtime" in next(line for line in lines if "pipeline-inner" in line)
    assert "predictions" in lines[-1]


def test_profile_traffic_and_simulated_iterations(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    # a CNN-like chain: big activations, few parameters -> the pipeline stays inside machines
    blocks = tuple(BlockProfile(f"conv{i}", 1e-3, 2e-3, 4e7, 4e7, 1e5) for i in range(8))
    path = tmp_path / "profile.json"
    Profile(blocks, model="chain", source="synthetic").save(path)
    code, out, _ = run(capsys, "placement", "--profile", str(path), "--topology", CLUSTER,
                       "--depth", "4", "--microbatches", "8", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["width"] == 4 and report["stages"] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    # M=8 over 4 copies: 2 per copy, each an output forward and its gradient back: 4 outputs
    assert report["p2p_bytes"] == [4 * 4e7] * 3 and report["allreduce_bytes"] == [2e5] * 4
    first, last = report["placements"][0], report["placements"][-1]
    assert first["name"] == "pipeline-inner" and first["wpipe_rule"] and first["runtime"]
    assert first["p2p_time"] == pytest.approx(3 * 1.6e8 / 1.2e10)
    assert first["simulated_iteration_time"] < last["simulated_iteration_time"]


@pytest.mark.parametrize("argv,message", [
    (["--depth", "3", "--p2p-bytes", "1", "--allreduce-bytes", "1"], "does not divide"),
    (["--depth", "4", "--p2p-bytes", "1"], "give both"),
    (["--depth", "4", "--p2p-bytes", "1", "--allreduce-bytes", "1", "--microbatches", "4"],
     "needs a profile"),
])
def test_mistakes_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                               message: str) -> None:
    code, _, err = run(capsys, "placement", "--topology", CLUSTER, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_profile_and_explicit_bytes_together_are_refused(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    random_profile(random.Random(0), 6).save(path)
    code, _, err = run(capsys, "placement", "--profile", str(path), "--topology", CLUSTER,
                       "--depth", "4", "--p2p-bytes", "1", "--allreduce-bytes", "1")
    assert code == 2 and "not both" in err
