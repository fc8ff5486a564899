"""Tensor parallelism inside a stage (``Plan.tp``, docs/sharding.md): ``pp=2,tp=2`` trains
the parameters a plain torch loop trains on the whole model (1F1B, interleaved 1F1B,
zb-h1), and ``pp=2,dp=2,tp=2`` with ``--shard full`` too (zb-h1 included); a process holds
half of every split linear; what this slice does not cover is refused in one line before
anything starts."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pipeweave.cli.cmd_train import add_parser as add_train, build_job
from pipeweave.runtime import BuiltinModel, Plan, launch_local, run_local
from pipeweave.runtime.communication.mesh import lane_groups, pipeline_results, process_of
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.testing import assert_matches_reference, reference_run

from runtime_jobs import GPT, MESH_JOB_REFUSALS, gpt_job, mlp_job

SPLIT = ("qkv.weight", "qkv.bias", "fc.weight", "fc.bias", "proj.weight")
"""What tensor parallelism splits over ``tp`` (a row-wise ``proj``'s bias stays whole)."""


def _job(schedule: str, **plan_fields: object):  # type: ignore[no-untyped-def]
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    return gpt_job(depth=2, schedule=schedule, chunks=chunks, steps=2,
                   plan_fields={"tp": 2, **plan_fields}, count_activations=True)


def _held_bytes(job, stages: list[int], tp: int) -> int:  # type: ignore[no-untyped-def]
    """Parameters, gradients and SGD momentum of ``stages`` on one of ``tp`` processes."""
    spec = job.model()
    total = 0
    for stage in stages:
        start, end = job.plan.stages[stage]
        for block in spec.blocks[start:end]:
            for name, param in block.named_parameters():
                share = tp if name.endswith(SPLIT) else 1
                total += 3 * param.numel() * param.element_size() // share
    return total


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zb-h1"])
def test_pp2_tp2_trains_the_whole_models_parameters(schedule: str) -> None:
    job = _job(schedule)
    results = launch_local(job, deadline_s=500)
    assert sorted(r.rank for r in results) == [0, 1]  # one result per pipeline rank
    assert_matches_reference(results, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)
    layout = job.plan.layout()
    for result in results:  # each process holds half of every split linear
        stages = list(layout.stages_of(result.rank))
        assert result.state_bytes == _held_bytes(job, stages, 2), (result.rank, stages)
        assert result.state_bytes < _held_bytes(job, stages, 1)


@pytest.mark.distributed
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("schedule", "shard"), [("1f1b", "full"), ("interleaved-1f1b", "full"),
                                                 ("zb-h1", "full"), ("1f1b", "grad-op"),
                                                 ("1f1b", "none")])
def test_pp2_dp2_tp2_trains_the_whole_models_parameters(schedule: str, shard: str) -> None:
    job = _job(schedule, width=2, shard=shard)  # 8 processes; FSDP2 over dp on (dp, tp)
    results = launch_local(job, deadline_s=800)
    assert sorted(r.rank for r in results) == [0, 1, 2, 3]
    assert_matches_reference(results, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)
    share = 1.0 if shard == "none" else 0.5  # sharded: a quarter of every split linear
    for result in results:
        stages = list(job.plan.layout().stages_of(result.rank))
        assert abs(result.state_bytes / _held_bytes(job, stages, 2) - share) < 0.05


def test_processes_and_lanes() -> None:
    plan = Plan.uniform(6, 2, width=2, shard="full", tp=2)
    assert (plan.world_size, plan.processes) == (4, 8)
    assert process_of(3, 1, 2) == 7
    assert lane_groups([(0, 2), (1, 3)], 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert pipeline_results(["r0t0", "r0t1", "r1t0", "r1t1"], 2) == ["r0t0", "r1t0"]


@pytest.mark.parametrize(("fields", "words"), [
    ({"tp": 0}, "int >= 1"),
    ({"tp": 2, "schedule": "pipedream", "microbatches": 2}, "asynchronous schedule"),
    ({"tp": 2, "replicas": (2, 1)}, "replicated stages"),
    ({"tp": 2, "pipelines": 2, "schedule": "avgpipe"}, "parallel pipelines"),
])
def test_plan_refusals(fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Plan.uniform(6, 2, **fields)


@pytest.mark.parametrize(("job_fields", "words"), MESH_JOB_REFUSALS)
def test_job_refusals_before_anything_starts(job_fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=f"tp=2 with {words}"):
        prepare(dataclasses.replace(_job("1f1b"), **job_fields))


@pytest.mark.parametrize(("overrides", "words"), [
    ({"n_heads": 1, "d_model": 32}, "does not divide the 1 attention heads"),
    ({"d_ff": 63}, "does not divide the MLP width 63"),
    ({"dropout": 0.1}, "dropout"),
])
def test_model_refusals(overrides: dict, words: str) -> None:
    job = _job("1f1b")
    model = BuiltinModel("gpt-tiny", dtype="float64", overrides={**GPT, **overrides})
    with pytest.raises(ValueError, match=words):
        prepare(dataclasses.replace(job, model=model))


def test_other_models_and_single_process_refused() -> None:
    with pytest.raises(ValueError, match="only the built-in GPT .* Llama family"):
        prepare(mlp_job(depth=2, plan_fields={"tp": 2}))
    fused = dataclasses.replace(_job("1f1b"), optimizer=dataclasses.replace(
        _job("1f1b").optimizer, implementation="fused"))
    with pytest.raises(ValueError, match="tp=2 with a fused optimizer step"):
        prepare(fused)
    with pytest.raises(ValueError, match="single-process executor"):
        run_local(_job("1f1b"))


def test_cli_mesh_with_tp() -> None:
    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    args = parser.parse_args(["train", "--model", "gpt-tiny", "--mesh", "pp=2,dp=2,tp=2",
                              "--shard", "full"])
    plan = build_job(args).plan
    assert (plan.depth, plan.width, plan.tp, plan.shard) == (2, 2, 2, "full")


def test_torchtitan_config_names_the_tensor_parallel_degree() -> None:
    import tomllib

    from pipeweave.planner.interchange import torchtitan_config

    names = ["embed", *(f"layer{i}" for i in range(6)), "head"]
    plan = Plan(num_blocks=8, stages=((0, 4), (4, 8)), microbatches=4, width=2, shard="full",
                tp=2)
    config = tomllib.loads(torchtitan_config(plan, names, batch_size=8))["parallelism"]
    assert (config["tensor_parallel_degree"], config["data_parallel_shard_degree"]) == (2, 2)


def _mesh_facts(process: int, store_path: str, out: str) -> None:
    import json

    import torch.distributed as dist

    from pipeweave.runtime.execution.tensor_parallel import make_rank_mesh

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 8), rank=process,
                            world_size=8)
    try:
        mesh = make_rank_mesh(depth=2, width=2, tp=2, process=process, device_type="cpu")
        facts = {"rank": mesh.rank, "index": mesh.tp_index, "coordinates": mesh.coordinates,
                 "tp": dist.get_process_group_ranks(mesh.tp_mesh.get_group()),
                 "dp": dist.get_process_group_ranks(mesh.dp_mesh.get_group())}
        with open(f"{out}/{process}.json", "w") as handle:
            json.dump(facts, handle)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_every_process_knows_its_place_in_the_mesh(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """pp=2,dp=2,tp=2: process p runs pipeline rank p // 2 (copy k, position s: rank 2k + s)
    at tp index p % 2; its tp group is its rank's two processes, its dp group the same tp
    index of the same position in the other copy (the lanes of the dp all-reduce)."""
    import json

    import torch.multiprocessing as mp

    mp.start_processes(_mesh_facts, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=8,
                       start_method="fork")  # no fresh interpreters: 8 on a few cores
    for process in range(8):
        facts = json.loads((tmp_path / f"{process}.json").read_text())
        rank, index = divmod(process, 2)
        copy, position = divmod(rank, 2)
        assert (facts["rank"], facts["index"]) == (rank, index)
        assert facts["coordinates"] == [position, copy, index]
        assert sorted(facts["tp"]) == [2 * rank, 2 * rank + 1]
        assert sorted(facts["dp"]) == sorted(lane_groups([(position, position + 2)], 2)[index])


def test_cli_counts_tp_processes(capsys) -> None:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    from pipeweave.cli.train_avgpipe import check_ranks

    args = parser.parse_args(["train", "--model", "gpt-tiny", "--ranks", "4"])
    plan = Plan.uniform(10, 2, tp=2)
    check_ranks(args, plan, under_torchrun=False)  # 2 pipeline ranks x tp 2 = 4 processes
    args = parser.parse_args(["train", "--model", "gpt-tiny", "--ranks", "2"])
    with pytest.raises(ValueError, match=r"needs 4 ranks \(--stages 2 x tp 2\)"):
        check_ranks(args, plan, under_torchrun=False)
