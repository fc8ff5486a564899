"""A rank that dies (SIGKILL) never leaves the others running; torchrun restarts resume.

* launch_local: a rank SIGKILLed mid-iteration -> RunFailed naming it within seconds, every
  rank process gone (their pids are recorded by the data factory);
* the launcher itself SIGKILLed -> its ranks notice and exit;
* ``torchrun --max-restarts 1``: a rank kills itself once mid-step; the restarted ranks
  resume from the last complete checkpoint (``--resume auto``) and finish with exactly the
  losses and parameters of a run that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pipeweave.cli.cmd_train import add_parser, build_job
from pipeweave.runtime import RunFailed, launch_local, run_local
from pipeweave.runtime.checkpoint.store import StoredCheckpoint, complete_checkpoints
from pipeweave.runtime.observation.summary import iteration_losses
from pipeweave.testing import merged_parameters

from checkpoint_jobs import KillingData, mlp_job, wait_dead

pytestmark = pytest.mark.distributed
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _pids(folder: Path, world: int, within_s: float = 60) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        files = sorted(folder.glob("rank*.pid"))
        if len(files) == world:
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"only {len(list(folder.glob('rank*.pid')))} of {world} ranks started")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("world", "victim", "how"), [
    (2, 1, {"at_batch": 3}),     # the last stage, when it reads step 4's targets
    (4, 2, {"after_s": 2.0}),    # a middle stage, 2 s into the run (mid-iteration)
    (4, 0, {"at_batch": 5}),     # the first stage, mid step 6
], ids=["2ranks-last", "4ranks-middle", "4ranks-first"])
def test_sigkilled_rank_stops_the_run_naming_it(world: int, victim: int, how: dict,
                                                tmp_path: Path) -> None:
    # The peers' own timeout (600 s) is past the deadline: only the launcher stops them before it.
    job = dataclasses.replace(mlp_job(depth=world, steps=400), timeout_s=600.0,
                              data=KillingData(rank=victim, pids=str(tmp_path), **how))
    with pytest.raises(RunFailed, match=rf"rank {victim} exited with code -9 \(signal SIGKILL\); "
                                        rf"all other ranks were stopped"):
        launch_local(job, deadline_s=150)
    # Every rank that reached its data wrote its pid; on a loaded machine a rank may still have
    # been building its model when the victim died 2 s in (and been stopped before writing it):
    # those are covered by active_children() below.
    pids = [int(f.read_text()) for f in tmp_path.glob("rank*.pid")]
    assert f"rank{victim}.pid" in {f.name for f in tmp_path.glob("rank*.pid")}
    assert wait_dead(pids, within_s=10) == []
    assert not multiprocessing.active_children()


LAUNCHER = """
import dataclasses, sys, time
from checkpoint_jobs import KillingData, mlp_job
from pipeweave.runtime import launch_local
job = dataclasses.replace(mlp_job(depth=2, steps=3000),
                          data=KillingData(rank=-1, pids=sys.argv[1]))
launch_local(job)
"""


@pytest.mark.timeout(120)
def test_ranks_exit_when_the_launcher_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], env=env)
    try:
        pids = _pids(tmp_path, 2)
        time.sleep(1.0)  # let them train
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_dead(pids, within_s=10) == [], "ranks outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()


TRAIN = ["--model", "mlp", "--stages", "2", "--steps", "8", "--batch-size", "16",
         "--microbatches", "4", "--dtype", "float64", "--seed", "3", "--no-progress",
         "--timeout", "30"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None
                    and shutil.which("torchrun") is None, reason="torchrun not available")
def test_torchrun_restart_resumes_from_the_last_complete_checkpoint(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    marker, checkpoints = tmp_path / "killed-once", tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(SRC),
           "PIPEWEAVE_INJECT_FAULT": f"rank=1,step=6,once={marker}"}
    command = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
               "--monitor-interval", "0.5", "-m", "pipeweave", "train", *TRAIN,
               "--checkpoint-every", "2", "--checkpoint-dir", str(checkpoints),
               "--resume", "auto", "--output-dir", str(tmp_path / "out")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    # The whole stderr: every rank's traceback of every attempt, not only the last rank's.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert marker.exists()  # rank 1 did die once, during step 6
    # The newest *complete* checkpoint then: after step 4, or after step 2 if rank 1's writer
    # had not finished step 4's shard (written in the background) when it was killed.
    resumed = re.search(r"resuming from \S+ after step (\d) of 8", done.stdout)
    assert resumed is not None and int(resumed.group(1)) in (2, 4), done.stdout
    # The uninterrupted reference: the same command line, one process.
    import argparse

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", *TRAIN])
    reference = run_local(dataclasses.replace(build_job(args), return_parameters=True))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    want = iteration_losses(reference, 4)
    # Steps up to the checkpoint come from its loss history, the rest were recomputed.
    assert [step for step in range(1, 9) if summary["losses"][step - 1] == want[step - 1]] == \
        [1, 2, 3, 4, 5, 6, 7, 8]
    final = StoredCheckpoint(complete_checkpoints(checkpoints)[-1])
    assert final.step == 8
    parameters = {}
    for shard in final.shards:
        parameters.update(final.load(shard)["parameters"])
    reference_parameters = merged_parameters(reference)
    assert parameters.keys() == reference_parameters.keys()
    for name, value in reference_parameters.items():
        assert torch.equal(parameters[name], value), name
