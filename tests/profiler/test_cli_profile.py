"""``pipeweave profile``: measuring a built-in model and importing PipeDream's graph.txt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.profiler import Profile

PROFILES = Path("/work/shared/reference/pipedream-profiles")


def test_profile_builtin_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "mlp.json"
    code = main(["profile", "--model", "mlp", "--batch-size", "8", "--no-link", "--warmup", "0",
                 "--repeats", "1", "--threads", "1", "--json-out", str(out_file)])
    out, _ = capsys.readouterr()
    assert code == 0 and "fwd ms" in out and f"wrote {out_file}" in out
    profile = Profile.load(out_file)
    assert profile.model == "mlp" and profile.batch_size == 8 and profile.num_blocks == 4
    assert [b.name for b in profile.blocks] == ["fc0", "fc1", "fc2", "head"]
    # the runtime's costs per action are measured by default and shown
    assert profile.runtime is not None and "runtime costs (us)" in out
    assert set(profile.runtime.per_action) >= {"forward", "backward", "update"}


def test_runtime_costs_can_be_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "mlp", "--no-link", "--no-runtime-costs", "--warmup", "0",
                 "--repeats", "1", "--json"]) == 0
    assert "runtime" not in json.loads(capsys.readouterr().out)


def test_runtime_costs_need_full_precision_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "mlp", "--no-link", "--precision", "bf16-mixed",
                 "--warmup", "0", "--repeats", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "runtime" not in json.loads(out)
    assert "runtime costs are measured in full precision only" in err


@pytest.mark.skipif(not PROFILES.exists(), reason="reference profiles not present")
def test_import_pipedream_graph(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "alexnet.json"
    code = main(["profile", "--pipedream-graph", str(PROFILES / "alexnet.txt"), "--json-out",
                 str(out_file), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["source"] == "pipedream-graph"
    assert Profile.load(out_file).num_blocks == 21
