"""Automatic precision compression through the transports (``Job.apc``, ``--apc``).

What APC must hold: about half the bytes for float32; the same numbers in the single-process
executor and in real processes; training within a stated bound of the uncompressed run; and
full precision whenever the codec falls back (inf, overflow, underflow).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeweave.cli.main import main
from pipeweave.ir import Action, Op
from pipeweave.runtime import launch_local, run_local
from pipeweave.apc import decode, encode
from pipeweave.host import FORKSERVER_PRELOAD
from pipeweave.runtime.communication.transport import DistTransport, LocalTransport, Waiting, message_tag
from pipeweave.testing import assert_identical_runs, iteration_losses

from runtime_jobs import GPT, gpt_job, mlp_job

HEADER = 80  # one-time shape header per channel: 10 x int64
META = 16  # APC metadata per message: mode and exponent, 2 x int64


def _received(waiting: Waiting) -> torch.Tensor:
    """Drive a receive generator of a transport that never yields."""
    try:
        next(waiting)
    except StopIteration as done:
        return done.value
    raise AssertionError("a receive yielded although its message was sent")


# -- bytes --------------------------------------------------------------------------------

def test_apc_halves_the_bytes_of_a_float32_run() -> None:
    job = gpt_job(depth=2, dtype="float32", steps=3)
    plain = run_local(job)
    compressed = run_local(dataclasses.replace(job, apc=True))
    # Every rank sends M = 4 messages per step (activations forward, gradients back) of
    # 2 rows x seq_len x d_model floats, after one header.
    elements = 2 * GPT["seq_len"] * GPT["d_model"]
    messages = 4 * job.steps
    assert [r.bytes_sent for r in plain] == [HEADER + messages * 4 * elements] * 2
    assert [r.bytes_sent for r in compressed] == [HEADER + messages * (META + 2 * elements)] * 2
    ratio = sum(r.bytes_sent for r in compressed) / sum(r.bytes_sent for r in plain)
    assert ratio <= 0.55  # 0.506 here: fp16 payloads, plus metadata and headers


# -- accuracy -----------------------------------------------------------------------------

# Bounds on the relative difference between every iteration's loss with and without APC.
# Each transmitted element is off by at most 2**-11 (fp16 rounding), and the first loss moves
# by about that times the loss's sensitivity to its inputs; rounding errors are unbiased, so
# it moves much less (measured: 1e-6). Training then amplifies any perturbation: the float32
# and float64 runs of the same MLP job drift apart 500-fold over 20 steps too. So the bound
# is a statement over a horizon, not a convergence claim. Measured maxima (CPU, torch 2.x):
#   gpt-tiny, Adam lr 1e-3, 20 steps: 1.8e-6 — bound 2**-11 = 4.9e-4, the per-element bound
#   mlp, Adam lr 1e-2 (aggressive), 10 steps: 1.1e-3 — bound 1e-2 (it reaches 7e-3 by step 18)
@pytest.mark.parametrize("job, bound", [
    pytest.param(gpt_job(depth=2, dtype="float32", optimizer="adam", steps=20), 2.0**-11,
                 id="gpt-adam-20steps"),
    pytest.param(mlp_job(depth=4, dtype="float32", steps=10), 1e-2, id="mlp-adam-10steps"),
])
def test_float32_training_stays_close_to_uncompressed(job, bound: float) -> None:
    plain = iteration_losses(run_local(job), job.plan.microbatches)
    compressed = iteration_losses(run_local(dataclasses.replace(job, apc=True)),
                                  job.plan.microbatches)
    assert len(compressed) == len(plain) == job.steps
    worst = max(abs(a - b) / abs(b) for a, b in zip(compressed, plain))
    assert worst <= bound
    assert compressed != plain  # APC did round something


# -- fallback through the local transport -------------------------------------------------

def _one_rank_trip(tensor: torch.Tensor, *, apc: bool = True) -> tuple[torch.Tensor, int]:
    hub = LocalTransport(apc=apc)
    sender, receiver = hub.endpoint(0), hub.endpoint(1)
    message = Action(Op.SEND_ACT, 0, 0)
    sender.send(message, tensor, 1)
    return _received(receiver.recv(message, 0)), sender.bytes_sent


def test_local_transport_rounds_like_the_codec() -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    got, sent = _one_rank_trip(x)
    assert torch.equal(got, decode(encode(x), torch.float32)) and not torch.equal(got, x)
    assert (got - x).abs().max() <= x.abs().max() * 2.0**-11
    assert sent == HEADER + META + 2 * x.numel()


@pytest.mark.parametrize("tensor", [
    pytest.param(torch.tensor([[1.0, float("inf")], [-2.0, 3.0]]), id="inf"),
    pytest.param(torch.tensor([1e6, 1e-9, 3.0], dtype=torch.float64), id="underflow-float64"),
])
def test_local_transport_falls_back_to_full_precision(tensor: torch.Tensor) -> None:
    got, sent = _one_rank_trip(tensor)
    assert got.dtype == tensor.dtype and torch.equal(got, tensor)
    assert sent == HEADER + META + tensor.numel() * tensor.element_size()


def test_other_dtypes_and_apc_off_travel_untouched() -> None:
    ids = torch.arange(12).reshape(3, 4)
    got, sent = _one_rank_trip(ids)
    assert torch.equal(got, ids) and sent == HEADER + ids.numel() * 8
    x = torch.randn(7, 3)
    got, sent = _one_rank_trip(x, apc=False)
    assert torch.equal(got, x) and sent == HEADER + x.numel() * 4


def test_tags_leave_room_for_the_fallback_bit() -> None:
    largest = Action(Op.SEND_GRAD, 1023, 4095, piece=2, pipeline=15)
    assert message_tag(largest) < 2**29


def test_cli_apc_flag_reports_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sent = {}
    for flag in ([], ["--apc"]):
        out = tmp_path / f"summary{len(flag)}.json"
        code = main(["train", "--model", "mlp", "--steps", "2", "--executor", "local",
                     "--no-progress", "--output-dir", str(tmp_path / f"run{len(flag)}"),
                     "--json-out", str(out), *flag])
        assert code == 0
        sent[bool(flag)] = json.loads(out.read_text())["bytes_sent"]
    capsys.readouterr()
    assert len(sent[True]) == 2 and 0 < sum(sent[True]) <= 0.55 * sum(sent[False])


# -- real processes -----------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("job", [
    pytest.param(gpt_job(depth=2, dtype="float32", steps=3, apc=True), id="gpt-1f1b-float32"),
    pytest.param(gpt_job(depth=2, schedule="gpipe", steps=3, apc=True), id="gpt-gpipe-float64"),
])
def test_distributed_apc_equals_single_process(job) -> None:
    distributed = launch_local(job, deadline_s=200)
    local = run_local(job)
    assert_identical_runs(distributed, local)
    assert [r.bytes_sent for r in distributed] == [r.bytes_sent for r in local]
    plain = run_local(dataclasses.replace(job, apc=False))
    assert sum(r.bytes_sent for r in distributed) <= 0.55 * sum(r.bytes_sent for r in plain)


# Messages rank 0 sends to rank 1 in order: three channels (float32 activations, float64
# gradients, int64; one shape per channel, as its header is sent once), with fallbacks (inf,
# underflow) between compressed messages, so that a fallback's second part arrives while
# later messages' receives are already posted.
def _messages() -> list[tuple[Action, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    act = [torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g),
           torch.randn(4, 8, generator=g) * 1e-3, torch.randn(4, 8, generator=g)]
    act[1][2, 3] = float("inf")
    act[3][0, 0] = 1e-12 * act[3].abs().max()  # would flush to zero in fp16: full precision
    grad = [torch.randn(5, dtype=torch.float64, generator=g) * 1e7,
            torch.tensor([1e-9, 1e6, 1.0, -2.0, 3.0], dtype=torch.float64)]
    ids = torch.arange(6).reshape(2, 3)
    return ([(Action(Op.SEND_ACT, 0, j), t) for j, t in enumerate(act)]
            + [(Action(Op.SEND_GRAD, 1, j), t) for j, t in enumerate(grad)]
            + [(Action(Op.SEND_ACT, 1, 0), ids)])


def _transport_rank(rank: int, init_method: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    try:
        transport = DistTransport(rank, torch.device("cpu"), datetime.timedelta(seconds=30),
                                  apc=True)
        messages = [message for message, _ in _messages()]
        if rank == 0:
            for message, tensor in _messages():
                transport.send(message, tensor, 1)
        else:
            received = []
            for index, message in enumerate(messages):
                for upcoming in messages[index:index + 2]:  # as the interpreter prefetches
                    transport.prefetch(upcoming, 0)
                received.append(_received(transport.recv(message, 0)))
            torch.save(received, Path(out_dir) / "received.pt")
        transport.finish()
        torch.save(transport.bytes_sent, Path(out_dir) / f"bytes{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_dist_transport_compresses_and_falls_back(tmp_path: Path) -> None:
    # forked by the launcher's fork server (torch already imported), meeting at a file store
    # of this test's own (no port to race for)
    mp.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    mp.start_processes(_transport_rank, args=(f"file://{tmp_path / 'store'}", str(tmp_path)),
                       nprocs=2, join=True, start_method="forkserver")
    received = torch.load(tmp_path / "received.pt")
    hub = LocalTransport(apc=True)
    sender, receiver = hub.endpoint(0), hub.endpoint(1)
    for (message, tensor), got in zip(_messages(), received, strict=True):
        sender.send(message, tensor, 1)
        want = _received(receiver.recv(message, 0))
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, message
        assert torch.equal(got, want), message
    fallbacks = [1, 3, 5]  # inf, underflow, underflow (float64); index 6 is int64
    for index, ((message, tensor), got) in enumerate(zip(_messages(), received)):
        assert torch.equal(got, tensor) == (index in fallbacks or index == 6), message
    assert torch.load(tmp_path / "bytes0.pt") == sender.bytes_sent
    assert torch.load(tmp_path / "bytes1.pt") == 0
