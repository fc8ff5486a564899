"""Mixed and pure bfloat16 (``Job.precision``, pipeweave.precision): equal to torch's own
autocast training, close to float32, lighter in memory; every refusal one clear line.

The oracle here is written with torch alone (``torch.autocast`` + ``backward`` + ``step``):
it imports nothing of pipeweave's precision code.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeweave.host import threads_per_rank
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.launch.processes import launch_local
from pipeweave.schedules import available_schedules
from pipeweave.testing import assert_identical_runs, iteration_losses, merged_parameters

from runtime_jobs import gpt_job

M = 4


def mixed(job: Job, precision: str = "bf16-mixed", **fields: object) -> Job:
    return dataclasses.replace(job, precision=precision, **fields)


def autocast_reference(job: Job) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Non-pipelined training with torch's autocast: the same micro-batches in the same order
    (each micro-batch's mean loss weighted by its share of the batch, gradients accumulated),
    then ``optimizer.step()``; forward and loss under autocast as torch's AMP recipe says."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank(job.plan.world_size))  # as run_local does
    try:
        spec = job.model().materialized()  # the values the stages are built with
        model = spec.sequential()
        optimizer = job.optimizer(model.parameters())
        data = iter(job.data())
        losses = []
        for _ in range(job.steps):
            inputs, targets = next(data)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for x, y in zip(inputs.chunk(job.plan.microbatches), targets.chunk(job.plan.microbatches)):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = spec.loss_fn(model(x), y) * (x.shape[0] / inputs.shape[0])
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            losses.append(total)
    finally:
        torch.set_num_threads(previous)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def float32_job(**fields: object) -> Job:
    return gpt_job(depth=2, dtype="float32", optimizer="adam", steps=3, **fields)


# -- refusals: one line naming the value and the fix ---------------------------------------------

@pytest.mark.parametrize(("precision", "fields", "message"), [
    ("fp16", {}, "--precision fp16 is not supported: fp16 needs a loss scale shared by all stages"),
    ("fp16-mixed", {}, "no such scaler"),
    ("bfloat", {}, "--precision 'bfloat' is unknown; choose one of full, bf16-mixed, bf16"),
    ("bf16", {"apc": True}, "--apc with --precision bf16 would do nothing"),
])
def test_refused_with_one_line(precision: str, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        mixed(float32_job(), precision, **fields)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_float64_model_refused(precision: str) -> None:
    with pytest.raises(ValueError, match="but the model is float64; build it in float32"):
        mixed(gpt_job(depth=2), precision)


# -- bf16-mixed equals torch's own autocast training ---------------------------------------------

@pytest.mark.parametrize(("schedule", "fields"), [
    ("1f1b", {}),
    ("gpipe", {"recompute": (True, True)}),
    ("zb-h1", {}),  # split backward: recording under autocast, W through the casts
    ("interleaved-1f1b", {"chunks": 2}),
])
def test_pipelined_bf16_mixed_equals_torch_autocast(schedule: str, fields: dict) -> None:
    """Identical operations in identical order (the stage boundary only detaches a tensor),
    so bit for bit: the same float32 master weights and losses."""
    chunks = fields.pop("chunks", 1)
    job = mixed(gpt_job(depth=2, dtype="float32", optimizer="adam", steps=3, schedule=schedule,
                        chunks=chunks, microbatches=M, plan_fields=fields))
    results = run_local(job)
    want_losses, want = autocast_reference(job)
    got = merged_parameters(results)
    assert got.keys() == want.keys()
    for name, expected in want.items():
        assert got[name].dtype == torch.float32, name  # float32 master weights
        assert torch.equal(got[name], expected), name
    assert iteration_losses(results, M) == pytest.approx(want_losses, rel=1e-12)
    # and autocast did run: float32 training ends elsewhere
    plain = merged_parameters(run_local(dataclasses.replace(job, precision="full")))
    assert any(not torch.allclose(plain[n], got[n], rtol=1e-6, atol=1e-7) for n in got)


# -- bf16-mixed close to float32 over 50 steps ---------------------------------------------------

def tiny_gpt_job(precision: str, *, steps: int, **fields: object) -> Job:
    """gpt-tiny as the CLI builds it (4 layers, d_model 64, seq 64), batch 8 in 4 micro-batches."""
    return Job(plan=Plan.uniform(10, 2, schedule="1f1b", microbatches=M), steps=steps,
               model=BuiltinModel("gpt-tiny"),
               data=BuiltinData("stdlib-bytes", batch_size=8, seq_len=64),
               optimizer=OptimizerFactory("adam", {"lr": 1e-3}), precision=precision,
               **fields)  # type: ignore[arg-type]


LOSS_TOLERANCE = 0.02
"""Largest |bf16-mixed loss - float32 loss| allowed at any of the 50 steps, in nats. bfloat16
keeps 8 significant bits (relative rounding 2**-9 = 0.2 %) in every matmul's inputs and
output; on losses of 2.5 to 5.5 nats that is up to ~0.01 per step, and the two runs'
weights drift apart slowly over the steps. Measured: at most 0.002 (docs/precision.md)."""


@pytest.mark.timeout(300)
def test_bf16_mixed_losses_within_tolerance_of_float32_over_50_steps() -> None:
    full = iteration_losses(run_local(tiny_gpt_job("full", steps=50)), M)
    bf16 = iteration_losses(run_local(tiny_gpt_job("bf16-mixed", steps=50)), M)
    assert len(full) == len(bf16) == 50
    differences = [abs(a - b) for a, b in zip(full, bf16)]
    assert max(differences) <= LOSS_TOLERANCE, max(differences)
    assert max(differences) > 0, "bf16-mixed must actually compute in bfloat16"
    assert bf16[-1] < bf16[0] - 1.0, "training must make progress"


# -- memory per rank -----------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_memory_per_rank_lower_with_bfloat16() -> None:
    """Counted activation bytes per rank (saved tensors, stage inputs and outputs): lower with
    bf16-mixed and lower still with bf16; model state: the same float32 master weights with
    bf16-mixed, half with bf16 (but for Adam's float32 step counters)."""
    counted = {p: run_local(tiny_gpt_job(p, steps=2, count_activations=True))
               for p in ("full", "bf16-mixed", "bf16")}
    for rank in (0, 1):
        held = {p: results[rank].peak_activation_bytes for p, results in counted.items()}
        state = {p: results[rank].state_bytes for p, results in counted.items()}
        assert 0 < held["bf16"] < held["bf16-mixed"] < held["full"], (rank, held)
        assert held["bf16-mixed"] < 0.9 * held["full"], (rank, held)
        assert state["bf16-mixed"] == state["full"], (rank, state)
        assert state["bf16"] <= 0.51 * state["full"], (rank, state)  # Adam's step counts stay


# -- every schedule --------------------------------------------------------------------------------

CHUNKS = {"interleaved-1f1b": 2, "wpipe": 2, "zbv": 2, "v-half": 2, "v-min": 2,
          "interleaved-zb": 2}
PIPELINES = {"avgpipe": 2}
DEFAULT_OPTIMIZER = {"spectrain": ("sgd", {"lr": 0.05, "momentum": 0.9})}


def grid_job(schedule: str, precision: str, *, recompute: bool = False) -> Job:
    chunks = CHUNKS.get(schedule, 1)
    name, kwargs = DEFAULT_OPTIMIZER.get(schedule, ("adam", {"lr": 1e-3}))
    plan_fields: dict[str, object] = {"pipelines": PIPELINES.get(schedule, 1)}
    if recompute:
        plan_fields["recompute"] = (True,) * (2 * chunks)
    plan = Plan.uniform(6, 2, chunks=chunks, schedule=schedule, microbatches=M, **plan_fields)  # type: ignore[arg-type]
    return Job(plan=plan, steps=2, model=BuiltinModel("gpt-tiny", overrides={
                   "n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 16}),
               data=BuiltinData("stdlib-bytes", batch_size=2 * M, seq_len=16),
               optimizer=OptimizerFactory(name, kwargs), return_parameters=True,
               precision=precision)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", [info.name for info in available_schedules()])
def test_every_schedule_runs_bf16_mixed_close_to_float32(schedule: str) -> None:
    """Every schedule (two ranks, recomputation on): bf16-mixed trains, its weights stay float32
    and within bfloat16's rounding of the float32 run's, and differ from them (autocast ran)."""
    full = merged_parameters(run_local(grid_job(schedule, "full", recompute=True)))
    got = merged_parameters(run_local(grid_job(schedule, "bf16-mixed", recompute=True)))
    assert got.keys() == full.keys()
    assert all(t.dtype == torch.float32 for t in got.values())
    worst = max(float((got[n] - full[n]).abs().max()) for n in got)
    assert 0 < worst < 0.02, (schedule, worst)  # Adam's steps are lr = 1e-3 each


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "pipedream", "2bw", "pipeoptim",
                                      "avgpipe", "wpipe"])
def test_pure_bf16_runs_with_bfloat16_weights(schedule: str) -> None:
    results = run_local(grid_job(schedule, "bf16"))
    assert all(t.dtype == torch.bfloat16 for t in merged_parameters(results).values())
    losses = iteration_losses(results, M)
    assert len(losses) == 2 and all(loss == loss for loss in losses)


# -- distributed, APC ----------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_distributed_equals_single_process(precision: str) -> None:
    """gloo carries bfloat16 messages and all-reduces (width 2: replicated stages)."""
    job = mixed(gpt_job(depth=2, dtype="float32", optimizer="adam", steps=2,
                        plan_fields={"width": 2}), precision)
    assert_identical_runs(launch_local(job, deadline_s=200), run_local(job))


def test_apc_compresses_the_float32_residual_stream_under_bf16_mixed() -> None:
    """Under autocast a GPT's residual stream stays float32 (the add promotes), so what crosses
    a stage boundary is float32 and APC halves it."""
    job = mixed(float32_job())
    plain = sum(r.bytes_sent for r in run_local(job))
    compressed = sum(r.bytes_sent for r in run_local(dataclasses.replace(job, apc=True)))
    assert compressed < 0.6 * plain


# -- checkpoints ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("precision", "stored"), [("bf16-mixed", "float32"), ("bf16", "bfloat16")])
def test_checkpoint_holds_the_master_weights_and_resumes_exactly(precision: str, stored: str,
                                                                  tmp_path) -> None:  # type: ignore[no-untyped-def]
    """bf16-mixed checkpoints the float32 master weights (and float32 optimizer state); bf16
    its bfloat16 ones; either resumes bit for bit."""
    import json

    from pipeweave.runtime.checkpoint.options import CheckpointOptions
    from pipeweave.runtime.checkpoint.store import MANIFEST, complete_checkpoints

    job = mixed(gpt_job(depth=2, dtype="float32", optimizer="adam", steps=4), precision)
    straight = run_local(job)
    run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(directory=str(tmp_path),
                                                                    every=2)))
    after2 = complete_checkpoints(tmp_path)[0]
    manifest = json.loads((after2 / MANIFEST).read_text())
    assert {p["dtype"] for p in manifest["parameters"].values()} == {stored}
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(after2))))
    a, b = merged_parameters(resumed), merged_parameters(straight)
    assert all(torch.equal(a[n], b[n]) for n in b)
    assert iteration_losses(resumed, M)[2:] == iteration_losses(straight, M)[2:]


def test_bf16_checkpoint_refused_by_a_float32_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipeweave.runtime.checkpoint.options import CheckpointOptions
    from pipeweave.runtime.checkpoint.store import CheckpointError

    job = mixed(gpt_job(depth=2, dtype="float32", optimizer="adam", steps=2), "bf16")
    run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(directory=str(tmp_path))))
    again = dataclasses.replace(job, precision="full", steps=4,
                                checkpoint=CheckpointOptions(resume=str(tmp_path)))
    with pytest.raises(CheckpointError, match="bfloat16.* there but float32"):
        run_local(again)


@pytest.mark.parametrize("model", ["hf-llama", "hf-gpt2"])
def test_hugging_face_model_bf16_mixed_equals_torch_autocast(model: str) -> None:
    """Rotary embeddings, masks and HF's shifted loss cross the stages under autocast too."""
    pytest.importorskip("transformers")
    spec = BuiltinModel(model)()
    job = Job(plan=Plan.uniform(len(spec.blocks), 2, schedule="1f1b", microbatches=M), steps=2,
              model=BuiltinModel(model), data=BuiltinData(spec.dataset or "stdlib-bytes",
                                                          batch_size=2 * M, seq_len=16),
              optimizer=OptimizerFactory("adam", {"lr": 1e-3}), return_parameters=True,
              precision="bf16-mixed")
    got = merged_parameters(run_local(job))
    _, want = autocast_reference(job)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], want[n]) for n in want)
