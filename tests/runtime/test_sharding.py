"""FSDP2 inside a stage (``Plan.shard``, docs/sharding.md): ``pp=2,dp=2`` sharded trains the
parameters the unsharded ``width=2`` run and one process train; a sharded rank holds about
``1/dp`` of the model state; the reduce-scatter waits for the update's last backward; what
this slice does not cover is refused in one line."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from pipeweave.cli.cmd_train import add_parser as add_train, build_job
from pipeweave.cli.options import parse_mesh
from pipeweave.ir import Op
from pipeweave.runtime import Plan, launch_local, run_local
from pipeweave.runtime.execution.parts import make_schedule
from pipeweave.runtime.execution.sharding import last_backwards
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.testing import assert_matches_reference, merged_parameters, reference_run

from runtime_jobs import MESH_JOB_REFUSALS, gpt_job

CASES = [("1f1b", "full", {}), ("1f1b", "grad-op", {}), ("gpipe", "full", {}),
         ("gpipe", "grad-op", {}), ("interleaved-1f1b", "full", {}),
         ("gpipe", "full", {"recompute": (True, True)}),
         ("sliced-1f1b", "full", {"schedule_options": {"sliced": 2}}),
         ("gpipe-grouped", "grad-op", {}),
         # split backward (I, then W): the reduce-scatter at the update's last W
         ("zb-h1", "full", {}), ("zb-h1", "grad-op", {}), ("zb-h2", "full", {}),
         ("zb-h2", "grad-op", {}), ("interleaved-zb", "full", {}),
         ("interleaved-zb", "grad-op", {}), ("zbv", "grad-op", {}), ("v-half", "full", {}),
         ("v-min", "grad-op", {}), ("dualpipev", "full", {"microbatches": 8}),
         ("zb-h1", "full", {"recompute": (True, True)})]
TWO_CHUNKS = ("interleaved-1f1b", "gpipe-grouped", "interleaved-zb", "zbv", "v-half", "v-min",
              "dualpipev")


def _job(schedule: str, shard: str, fields: dict | None = None,
         **job_fields: object):  # type: ignore[no-untyped-def]
    fields = dict(fields or {})
    return gpt_job(depth=2, schedule=schedule, chunks=2 if schedule in TWO_CHUNKS else 1,
                   steps=2, microbatches=fields.pop("microbatches", 4),
                   plan_fields={"width": 2, "shard": shard, **fields}, **job_fields)


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("schedule", "shard", "fields"), CASES,
                         ids=[f"{s}-{m}{'-' + '-'.join(f) if f else ''}" for s, m, f in CASES])
def test_sharded_trains_the_unsharded_parameters(schedule: str, shard: str, fields: dict) -> None:
    job = _job(schedule, shard, fields, count_activations=True)
    sharded = launch_local(job, deadline_s=500)
    unsharded_job = dataclasses.replace(job, plan=dataclasses.replace(job.plan, shard="none"))
    unsharded = run_local(unsharded_job)  # width=2, proven equal to the distributed run
    got, want = merged_parameters(sharded), merged_parameters(unsharded)
    assert got.keys() == want.keys()
    for name in want:
        assert not hasattr(got[name], "to_local"), f"{name} came back sharded"
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)
    assert_matches_reference(sharded, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)
    # A sharded rank stores half of its stages' parameters, gradients and optimizer state.
    for mine, whole in zip(sorted(sharded, key=lambda r: r.rank), unsharded):
        assert mine.state_bytes is not None and whole.state_bytes is not None
        assert abs(mine.state_bytes / whole.state_bytes - 0.5) < 0.05, (mine.rank,
                                                                      mine.state_bytes,
                                                                      whole.state_bytes)


def test_reduce_scatter_waits_for_the_updates_last_backward() -> None:
    plan = Plan.uniform(6, 2, schedule="1f1b", microbatches=4, width=2, shard="full")
    schedule = make_schedule(plan, 2)
    for rank in range(schedule.num_ranks):
        for stage in schedule.layout.stages_of(rank):
            program = schedule.programs[rank]
            backwards = [a for a in program if a.op is Op.BACKWARD and a.stage == stage]
            # width 2: this copy runs every other micro-batch; 2 per iteration, 2 iterations
            assert len(backwards) == 4
            last = last_backwards(program, stage)
            assert last == {(backwards[1].microbatch, 0), (backwards[3].microbatch, 0)}


def test_a_split_backward_reduce_scatters_at_the_updates_last_W() -> None:
    plan = Plan.uniform(6, 2, schedule="zb-h1", microbatches=4, width=2, shard="full")
    schedule = make_schedule(plan, 2)
    for rank in range(schedule.num_ranks):
        program = schedule.programs[rank]
        stage = schedule.layout.stages_of(rank)[0]
        # the first stage needs no input gradient: B there, I then W on the last stage
        op = Op.BACKWARD if stage == 0 else Op.BACKWARD_WEIGHT
        weights = [a for a in program if a.op is op and a.stage == stage]
        assert len(weights) == 4
        assert last_backwards(program, stage) == {(weights[1].microbatch, 0),
                                                  (weights[3].microbatch, 0)}


@pytest.mark.parametrize(("fields", "words"), [
    ({"shard": "zero3"}, "give --shard full"),
    ({"shard": "full"}, "width is 1"),
    ({"shard": "full", "width": 2, "schedule": "pipedream", "microbatches": 2},
     "asynchronous schedule 'pipedream'"),
    ({"shard": "full", "replicas": (2, 1)}, "replicated stages"),
])
def test_plan_refusals(fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Plan.uniform(6, 2, **fields)


@pytest.mark.parametrize(("job_fields", "words"), MESH_JOB_REFUSALS)
def test_job_refusals_before_anything_starts(job_fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=f"--shard full with {words}"):
        prepare(_job("1f1b", "full", **job_fields))


def test_tensor_parallelism_on_an_older_torch_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's DTensor fails to redistribute the head-split qkv weight (seen on the GPU
    machine, docs/gpu.md): one line before anything starts, not a rank's traceback."""
    from torch.torch_version import TorchVersion

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.11.0+cu130"))
    job = _job("1f1b", "none")
    job = dataclasses.replace(job, plan=dataclasses.replace(job.plan, width=1, tp=2))
    with pytest.raises(ValueError, match=r"^tp=2 needs torch 2\.13 or newer, this is torch "
                                         r"2\.11\.0\+cu130: .* use tp=1$"):
        prepare(job)


def test_fused_step_and_single_process_refused() -> None:
    job = _job("1f1b", "full")
    fused = dataclasses.replace(job, optimizer=dataclasses.replace(job.optimizer,
                                                                   implementation="fused"))
    with pytest.raises(ValueError, match="fused"):
        prepare(fused)
    with pytest.raises(ValueError, match="single-process executor"):
        run_local(job)


def _train_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    return parser.parse_args(["train", "--model", "mlp", *flags])


def test_mesh_is_stages_and_width() -> None:
    assert parse_mesh("pp=2,dp=3") == (2, 3, 1)
    assert parse_mesh("pp=4") == (4, 1, 1)
    assert parse_mesh("dp=2,pp=2,tp=1") == (2, 2, 1)
    job = build_job(_train_args("--mesh", "pp=2,dp=2", "--shard", "grad-op"))
    assert (job.plan.depth, job.plan.width, job.plan.shard) == (2, 2, "grad-op")
    assert build_job(_train_args("--stages", "2")).plan.shard == "none"


@pytest.mark.parametrize(("flags", "words"), [
    (("--mesh", "pp=2,xx=2"), "NAME=N"),
    (("--mesh", "dp=2"), "names no pp"),
    (("--mesh", "pp=2,dp=2", "--width", "2"), "give one of them"),
    (("--mesh", "pp=2,dp=2", "--shard", "full", "--executor", "local"), "--executor local"),
])
def test_cli_refusals(flags: tuple[str, ...], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build_job(_train_args(*flags))


def _tied_model():  # type: ignore[no-untyped-def]
    from torch import nn

    from pipeweave.models import ModelSpec
    from pipeweave.testing import TiedHead

    embed = nn.Embedding(11, 6).double()
    return ModelSpec.from_blocks([embed, nn.Linear(6, 6).double(), nn.Tanh(), TiedHead(embed.weight)],
                                 nn.functional.cross_entropy, "tiny-tied")


def test_tied_parameters_refused() -> None:
    def data():  # type: ignore[no-untyped-def]
        while True:
            ids = torch.randint(0, 11, (8, 5))
            yield ids, ids

    job = dataclasses.replace(_job("1f1b", "full"), model=_tied_model, data=data,
                              plan=Plan.uniform(4, 2, width=2, shard="full"))
    with pytest.raises(ValueError, match="--shard full with tied parameters"):
        prepare(job)


@pytest.fixture
def one_rank_group(tmp_path):  # type: ignore[no-untyped-def]
    """A one-rank gloo group, in this process, for the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def reduce_scatters(monkeypatch):  # type: ignore[no-untyped-def]
    """A list that grows by one at every FSDP2 reduce-scatter (``foreach_reduce``)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    reduced: list[int] = []
    real = _fsdp_param_group.foreach_reduce

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        reduced.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_fsdp_param_group, "foreach_reduce", counted)
    return reduced


def _two_layers():  # type: ignore[no-untyped-def]
    """A two-block module and detached copies of its parameters, for the reference."""
    from torch import nn

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    return module, [p.detach().clone().requires_grad_() for p in module.parameters()]


def _assert_gradient_is_the_sum(module, plain, inputs) -> None:  # type: ignore[no-untyped-def]
    """The sharded ``module``'s gradient is the sum over ``inputs`` of the plain one's."""
    w1, b1, w2, b2 = plain
    loss = sum((torch.tanh(x @ w1.t() + b1) @ w2.t() + b2).sum() for x in inputs)
    loss.backward()  # type: ignore[union-attr]
    for param, want in zip(module.parameters(), plain):
        torch.testing.assert_close(param.grad.full_tensor(), want.grad)  # type: ignore[union-attr]


def test_one_reduce_scatter_per_update(one_rank_group, reduce_scatters) -> None:  # type: ignore[no-untyped-def]
    """Four backwards, one update: FSDP2 reduces once, at the last, and the gradient is the
    sum of the four (a one-rank group, in this process)."""
    from pipeweave.ir import Action
    from pipeweave.runtime.execution.sharding import shard_stage

    module, plain = _two_layers()
    program = [*(Action(Op.FORWARD, 0, j) for j in range(4)),
               *(Action(Op.BACKWARD, 0, j) for j in range(4)), Action(Op.STEP, 0, version=1)]
    sharding = shard_stage(module, one_rank_group, "full", device_type="cpu",
                           program=program, stage=0)
    inputs = torch.randn(4, 3, 4, dtype=torch.float64)
    for j in range(4):
        sharding.before_backward(j, 0)
        module(inputs[j]).sum().backward()
        assert len(reduce_scatters) == (2 if j == 3 else 0)  # one per sharded block, at the last
    _assert_gradient_is_the_sum(module, plain, inputs)


def test_torchtitan_config_shards_the_width() -> None:
    import tomllib

    from pipeweave.planner.interchange import torchtitan_config

    names = ["embed", *(f"layer{i}" for i in range(6)), "head"]
    for shard, extra in (("full", {}), ("grad-op", {"fsdp_reshard_after_forward": "never"})):
        plan = Plan(num_blocks=8, stages=((0, 4), (4, 8)), microbatches=4, width=2, shard=shard)
        config = tomllib.loads(torchtitan_config(plan, names, batch_size=8))["parallelism"]
        assert {k: v for k, v in config.items() if "data_parallel" in k or "fsdp" in k} == {
            "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2, **extra}


@pytest.mark.parametrize("mode", ["full", "grad-op"])
def test_split_backward_reduce_scatters_once_at_the_last_W(one_rank_group, reduce_scatters,  # type: ignore[no-untyped-def]
                                                           mode: str) -> None:
    """Four I's, then four W's, one update: nothing is reduced at an I, FSDP2 reduces once, at
    the last W, and the gradient is the sum of the four (a one-rank group, in this process)."""
    from pipeweave.ir import Action
    from pipeweave.runtime.execution.sharding import shard_stage
    from pipeweave.split_backward import input_gradient, recording

    module, plain = _two_layers()
    program = [*(Action(Op.FORWARD, 0, j) for j in range(4)),
               *(Action(Op.BACKWARD_INPUT, 0, j) for j in range(4)),
               *(Action(Op.BACKWARD_WEIGHT, 0, j) for j in range(4)),
               Action(Op.STEP, 0, version=1)]
    sharding = shard_stage(module, one_rank_group, mode, device_type="cpu",
                           program=program, stage=0)
    inputs = torch.randn(4, 3, 4, dtype=torch.float64, requires_grad=True)
    pending = []
    for j in range(4):
        with recording(module) as recorded:
            loss = module(inputs[j]).sum()
        sharding.before_input_gradient()
        pending.append(input_gradient(module, inputs[j], loss, None, recorded)[1])
    assert not reduce_scatters
    for j in range(4):
        sharding.weight_gradient(j, 0, [pending[j]])
        assert not pending[j].parts  # every part ran, each block gathered on its own
        assert len(reduce_scatters) == (2 if j == 3 else 0)  # one per sharded block, at the last
    _assert_gradient_is_the_sum(module, plain, inputs.detach())
