"""Two torchrun "nodes" (two agents on this machine's loopback, c10d rendezvous), 2 ranks
each, one pipeline of 4 stages; a rank on the second node is killed once mid-step and
``--max-restarts 1`` restarts every node's workers, which resume from the last complete
checkpoint and finish with the losses of a run that was never interrupted (issue 13, item 15).
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives every restart a fresh store; without it a
multi-node run with restarts is refused (``restart_safe_store``).
On a cluster the same command runs once per node (examples/slurm_train.sh).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.cli.cmd_train import add_parser, build_job
from pipeweave.runtime import run_local
from pipeweave.host import free_port
from pipeweave.runtime.observation.summary import iteration_losses

pytestmark = pytest.mark.distributed
SRC = Path(__file__).resolve().parents[2] / "src"
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
TRAIN = ["--model", "mlp", "--stages", "4", "--steps", "6", "--batch-size", "16",
         "--microbatches", "4", "--dtype", "float64", "--seed", "5", "--no-progress",
         "--timeout", "30"]


@pytest.mark.timeout(420)
@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not available")
def test_two_nodes_survive_a_killed_rank_and_resume(tmp_path: Path) -> None:
    assert TORCHRUN is not None
    marker, checkpoints = tmp_path / "killed-once", tmp_path / "checkpoints"
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(SRC), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "PIPEWEAVE_INJECT_FAULT": f"rank=3,step=4,once={marker}"}
    nodes = [subprocess.Popen(
        [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", endpoint, "--rdzv-id", "pipeweave-test", "--max-restarts", "1",
         "--monitor-interval", "0.5", "-m", "pipeweave", "train", *TRAIN,
         "--checkpoint-every", "2", "--checkpoint-dir", str(checkpoints), "--resume", "auto",
         "--output-dir", str(tmp_path / "out")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=400))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, out[-3000:] + err[-6000:]
    assert marker.exists()  # rank 3 (on the second node) did die once, during step 4
    printed = "".join(out for out, _ in outputs)
    assert "resuming from" in printed and "after step 2 of 6" in printed
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    reference = run_local(build_job(parser.parse_args(["train", *TRAIN])))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["first_step"] == 2
    assert summary["losses"] == iteration_losses(reference, 4)


def test_restarts_on_several_nodes_sharing_the_agent_store_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeweave.runtime.launch.processes import restart_safe_store

    for key, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_WORLD_SIZE": "2",
                       "TORCHELASTIC_MAX_RESTARTS": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        restart_safe_store(5.0)
