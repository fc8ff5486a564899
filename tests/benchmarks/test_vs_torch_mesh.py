"""benchmarks/vs_torch_mesh.py's pure parts: the micro-batches a torch copy trains are those
pipeweave's width gives that copy, a row's ratios and training check come from its runs, and
the torch side refuses a mesh it cannot run. (No processes: the script's run is the check of
the rest, its rows' ``same_training``.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from torch_pipelining_worker import TorchSide, copy_rows  # noqa: E402
from vs_torch_mesh import MESHES, Mesh, mesh_row  # noqa: E402
from vs_torch_pipelining import CASES, Run  # noqa: E402

from pipeweave.ir import Op  # noqa: E402
from pipeweave.runtime import Plan  # noqa: E402
from pipeweave.runtime.execution.parts import make_schedule  # noqa: E402


@pytest.mark.parametrize(("microbatches", "dp"), [(4, 2), (8, 2), (6, 3), (4, 1)])
def test_copy_rows_are_the_microbatches_pipeweave_gives_the_copy(microbatches: int,
                                                                 dp: int) -> None:
    depth, rows_per = 2, 3
    plan = Plan.uniform(6, depth, schedule="1f1b", microbatches=microbatches, width=dp)
    schedule = make_schedule(plan, 1)
    batch = torch.arange(microbatches * rows_per)
    for copy in range(dp):
        program = schedule.programs[copy * depth]  # the copy's first stage
        mine = [a.microbatch for a in program if a.op is Op.FORWARD and a.microbatch is not None]
        assert len(mine) == microbatches // dp
        want = torch.cat([batch[j * rows_per:(j + 1) * rows_per] for j in mine])
        torch.testing.assert_close(copy_rows(batch, microbatches, dp, copy), want)


def _run(samples: float, rss: int, losses: list[float]) -> Run:
    return Run(samples, [rss // 2, rss], losses)


def test_mesh_row_takes_medians_ratios_and_checks_the_training() -> None:
    case, mesh = CASES["gpt"], MESHES["pp2-dp2-full"]
    runs = {"pipeweave": [_run(s, 300 * 2**20, [5.0, 4.0]) for s in (90.0, 120.0, 100.0)],
            "torch": [_run(s, 400 * 2**20, [5.0, 4.0001]) for s in (50.0, 40.0, 60.0)]}
    row = mesh_row(case, mesh, runs)
    assert (row["mesh"], row["processes"], row["shard"]) == ("pp=2,dp=2 full", 4, "full")
    assert row["pipeweave"]["samples_per_second"] == 100.0
    assert row["torch"]["samples_per_second"] == 50.0
    assert row["throughput_ratio"] == pytest.approx(2.0)
    assert row["peak_rss_ratio"] == pytest.approx(0.75)
    assert row["same_training"] is True
    runs["torch"][0] = _run(50.0, 400 * 2**20, [5.0, 4.1])  # another last loss: not the same
    assert mesh_row(case, mesh, runs)["same_training"] is False


def test_mesh_labels_and_processes() -> None:
    assert [(m.label, m.processes) for m in MESHES.values()] == [
        ("pp=2", 2), ("pp=2,dp=2", 4), ("pp=2,dp=2 full", 4), ("pp=2,dp=2 grad-op", 4),
        ("pp=2,tp=2", 4)]
    assert Mesh(2, dp=2, tp=2, shard="grad-op").label == "pp=2,dp=2,tp=2 grad-op"


@pytest.mark.parametrize(("fields", "words"), [
    ({"shard": "zero3", "dp": 2}, "shard 'zero3'"),
    ({"shard": "full"}, "nothing to shard over"),
    ({"dp": 3}, "dp must divide the micro-batches"),
])
def test_torch_side_refuses_a_mesh_it_cannot_run(fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TorchSide(model="gpt-tiny", overrides={}, stages=((0, 3), (3, 6)), schedule="1f1b",
                  microbatches=4, batch_size=8, seq_len=16, dataset="stdlib-bytes", steps=3,
                  lr=0.1, **fields)
    side = TorchSide(model="gpt-tiny", overrides={}, stages=((0, 3), (3, 6)), schedule="1f1b",
                     microbatches=4, batch_size=8, seq_len=16, dataset="stdlib-bytes", steps=3,
                     lr=0.1, dp=2, tp=2, shard="full")
    assert (side.ranks, side.processes) == (2, 8)
