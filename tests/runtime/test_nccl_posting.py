"""NCCL cannot deadlock on what the ranks post, for every registered schedule (issue 25).

NCCL runs a rank's point-to-point groups one after another in posting order, and a message
larger than its buffers moves only while its send and receive both run (rendezvous). The
real ranks' posts are recorded on the CPU (:mod:`nccl_posting`: real interpreter, transport
and comm stream, fake CUDA and NCCL) and played out by the model
(:func:`pipeweave.ir.rendezvous.run_posted`): every group must complete, and every send meet
the receive meant for it. With the receive window gloo uses (two receives posted ahead of
need, whatever the order), 1F1B deadlocks: each rank's early receive sits before the send its
peer waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipeweave.ir.rendezvous import run_posted
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan
from pipeweave.runtime.communication import streams
from pipeweave.runtime.communication.transport import DistTransport
from pipeweave.schedules import available_schedules, build_schedule, get_info, schedule_defaults

from nccl_posting import record_posting

SCHEDULES = [info.name for info in available_schedules()]
TINY = {"n_layers": 3, "d_model": 8, "n_heads": 2, "d_ff": 16, "seq_len": 4}  # 8 blocks
SHAPES = [(2, 2), (2, 5), (3, 6), (4, 8)]  # (depth, micro-batches wanted)


def job(schedule: str, depth: int, microbatches: int, *, apc: bool = False) -> Job:
    own = schedule_defaults(schedule, depth, microbatches=microbatches)
    name, kwargs = own.optimizer
    steps = 1 if get_info(schedule).synchronous else 3
    return Job(plan=Plan.uniform(8, depth, chunks=own.chunks, schedule=schedule,
                                 microbatches=own.microbatches),
               steps=steps, model=BuiltinModel("gpt-tiny", overrides=TINY), apc=apc,
               data=BuiltinData("stdlib-bytes", batch_size=2 * own.microbatches, seq_len=4),
               optimizer=OptimizerFactory(name, dict(kwargs)))


def _shapes(schedule: str) -> list[tuple[int, int]]:
    """The shapes of :data:`SHAPES` the schedule takes (at least two)."""
    taken = []
    for depth, microbatches in SHAPES:
        plan = job(schedule, depth, microbatches).plan
        if depth * plan.chunks > 8:
            continue
        try:
            build_schedule(schedule, plan.shape(1))
        except ValueError:
            continue  # e.g. interleaved-1f1b wants M a multiple of P
        taken.append((depth, microbatches))
    assert len(taken) >= 2, f"{schedule} takes {taken} of {SHAPES}"
    return taken


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_completes_under_rendezvous(schedule: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for depth, microbatches in _shapes(schedule):
        with monkeypatch.context() as patch:
            posted = record_posting(job(schedule, depth, microbatches), patch)
        outcome = run_posted(posted)
        assert outcome.completed, f"{schedule} P={depth} M={microbatches}: {outcome}"
        groups = [group for groups in posted.values() for group in groups]
        assert {group.channel for group in groups} == {"group"}  # batched: one communicator
        assert {len(group.ops) for group in groups} == {1}  # each group meets one of the peer


def _posted_when_used(job: Job, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many receives of ``job``'s run were posted only when used (not early)."""
    late = 0
    receive = DistTransport.recv

    def counting(self: DistTransport, message: Any, src: int) -> Any:
        nonlocal late
        late += message not in self._prefetched and message not in self._ready
        return receive(self, message, src)

    monkeypatch.setattr(DistTransport, "recv", counting)
    record_posting(job, monkeypatch)
    return late


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_receives_go_as_early_as_with_the_window(schedule: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlap is kept: no more receives wait until used than with gloo's window."""
    with monkeypatch.context() as patch:
        ordered = _posted_when_used(job(schedule, 3, 6), patch)
    with monkeypatch.context() as patch:
        patch.setattr(DistTransport, "rendezvous", property(lambda self: False))
        window = _posted_when_used(job(schedule, 3, 6), patch)
    print(f"{schedule}: posted when used {ordered} (gloo's window: {window})")
    assert ordered <= window


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zb-h1", "pipedream"])
def test_apc_messages_keep_the_order(schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """APC's second part (a fallback) follows the first on the wire; received whole when
    posted, nothing comes between them."""
    posted = record_posting(job(schedule, 2, 4, apc=True), monkeypatch)
    outcome = run_posted(posted)
    assert outcome.completed, f"{schedule} with APC: {outcome}"


def _lone_or_batched(ops: Sequence[Any]) -> list[Any]:
    """How :mod:`.streams` posted before: one operation alone, several in a batch."""
    if len(ops) == 1:
        ((op, tensor, peer, tag),) = ops
        return [op(tensor, peer, tag=tag)]
    return list(dist.batch_isend_irecv([dist.P2POp(op, tensor, peer, tag=tag)
                                        for op, tensor, peer, tag in ops]))


def _parts_batched(self: streams.MessageStreams, parts: Sequence[tuple[torch.Tensor, int]],
                   dst: int) -> list[Any]:
    """How :mod:`.streams` sent before: a message's parts (header and payload) in one batch."""
    with torch.cuda.stream(self.comm):
        return _lone_or_batched([(dist.isend, tensor, dst, tag) for tensor, tag in parts])


def test_the_gloo_window_deadlocks_on_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy before this one: receives two ahead, wherever they fall (gloo's, which
    buffers its sends). On NCCL 1F1B's steady state waits in a ring."""
    monkeypatch.setattr(DistTransport, "rendezvous", property(lambda self: False))
    posted = record_posting(job("1f1b", 2, 4), monkeypatch)
    outcome = run_posted(posted)
    assert not outcome.completed and outcome.mismatch is None
    assert outcome.cycle == (0, 1), str(outcome)


def test_lone_and_batched_posts_cross_on_an_unbound_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Posted as before (a lone operation alone, a header and its payload batched) on a
    process group not bound to a device, the first header's batched send goes on the group's
    communicator and its lone receive on the pair's, where it meets the next activation's
    lone send: the activation would land in the header's buffer."""
    monkeypatch.setattr(DistTransport, "rendezvous", property(lambda self: False))
    monkeypatch.setattr(streams, "_issue", _lone_or_batched)
    monkeypatch.setattr(streams.MessageStreams, "send", _parts_batched)
    outcome = run_posted(record_posting(job("1f1b", 2, 4), monkeypatch, bound=False))
    assert not outcome.completed and outcome.mismatch is not None, str(outcome)
    assert "rank 0's send" in outcome.mismatch and "rank 1's recv" in outcome.mismatch
