"""Jobs, fault-injecting data and comparisons shared by the checkpoint tests."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_jobs import GPT, gpt_job, mlp_job  # noqa: E402

from pipeweave.runtime import BuiltinModel, Job, RankResult  # noqa: E402
from pipeweave.runtime.checkpoint.options import CheckpointOptions  # noqa: E402
from pipeweave.runtime.checkpoint.store import StoredCheckpoint  # noqa: E402
from pipeweave.runtime.observation.summary import iteration_losses  # noqa: E402
from pipeweave.testing import merged_parameters  # noqa: E402

__all__ = ["gpt_job", "mlp_job", "dropout_gpt_job", "with_checkpoints", "assert_same_run",
           "assert_same_checkpoint_part",
           "assert_same_checkpoint", "KillingData", "KillAfterCheckpoint", "alive", "wait_dead",
           "iteration_losses"]


def dropout_gpt_job(**fields: Any) -> Job:
    """gpt-tiny with dropout 0.1: its result depends on every rank's random stream."""
    job = gpt_job(**fields)
    return dataclasses.replace(job, model=BuiltinModel("gpt-tiny", dtype="float64",
                                                       overrides={**GPT, "dropout": 0.1}))


def with_checkpoints(job: Job, **options: Any) -> Job:
    return dataclasses.replace(job, checkpoint=CheckpointOptions(**options))


def assert_same_run(got: Sequence[RankResult], want: Sequence[RankResult], *, microbatches: int,
                    steps: Sequence[int]) -> None:
    """Bit-identical parameters, and identical losses at the listed (1-based) steps."""
    a, b = merged_parameters(got), merged_parameters(want)
    assert a.keys() == b.keys() and a
    for name in b:
        assert torch.equal(a[name], b[name]), f"parameter {name} differs"
    losses_got, losses_want = iteration_losses(got, microbatches), iteration_losses(want, microbatches)
    assert len(losses_got) == len(losses_want)
    for step in steps:
        assert losses_got[step - 1] == losses_want[step - 1], f"loss at step {step} differs"


def assert_same_checkpoint(got: Path, want: Path) -> None:
    """Every shard of two checkpoints holds the same tensors and values (bit for bit)."""
    shards = sorted(p.name for p in want.glob("rank*.pt"))
    assert shards and sorted(p.name for p in got.glob("rank*.pt")) == shards
    for name in shards:
        assert_same_checkpoint_part(StoredCheckpoint(got).load(name),
                                    StoredCheckpoint(want).load(name), name)


def assert_same_checkpoint_part(got: Any, want: Any, where: str) -> None:
    """``got`` equals ``want`` bit for bit, nested dicts walked; tensors must be plain
    ``torch.Tensor`` (a checkpoint holds whole tensors, never a sharded DTensor)."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor and torch.equal(got, want), f"{where} differs"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: other keys"
        for key in want:
            assert_same_checkpoint_part(got[key], want[key], f"{where}[{key!r}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


class KillingData:
    """Digits batches. Every rank records its pid in ``pids/rank<r>.pid``; rank ``rank``
    SIGKILLs itself when it draws batch ``at_batch`` (first or last stage: the ranks that read
    data) or ``after_s`` seconds after building its stream (any rank)."""

    def __init__(self, *, rank: int, pids: str, at_batch: int | None = None,
                 after_s: float | None = None, batch_size: int = 16) -> None:
        self.rank, self.pids, self.at_batch, self.after_s = rank, pids, at_batch, after_s
        self.batch_size = batch_size

    def __call__(self):  # type: ignore[no-untyped-def]
        import threading

        import torch.distributed as dist

        from pipeweave.data import build_dataset

        me = dist.get_rank() if dist.is_initialized() else -1
        if me >= 0:
            Path(self.pids, f"rank{me}.pid").write_text(str(os.getpid()))
            if me == self.rank and self.after_s is not None:
                threading.Timer(self.after_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
        stream = build_dataset("digits", batch_size=self.batch_size, dtype=torch.float64)
        return _killing(stream, me == self.rank, self.at_batch)


def _killing(stream, armed: bool, at: int | None):  # type: ignore[no-untyped-def]
    for index, batch in enumerate(stream):
        if armed and index == at:
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch


class KillAfterCheckpoint(KillingData):
    """Like :class:`KillingData` with ``at_batch``, but the victim first waits (up to 60 s)
    until ``checkpoints`` holds a complete checkpoint, so the resumed run does resume."""

    def __init__(self, *, rank: int, pids: str, at_batch: int, checkpoints: str) -> None:
        super().__init__(rank=rank, pids=pids, at_batch=at_batch)
        self.checkpoints = checkpoints

    def __call__(self):  # type: ignore[no-untyped-def]
        import torch.distributed as dist

        stream = KillingData(rank=-1, pids=self.pids, batch_size=self.batch_size)()
        armed = dist.is_initialized() and dist.get_rank() == self.rank
        return _kill_after_checkpoint(stream, armed, self.at_batch, Path(self.checkpoints))


def _kill_after_checkpoint(stream, armed: bool, at: int | None, folder: Path):  # type: ignore[no-untyped-def]
    from pipeweave.runtime.checkpoint.store import complete_checkpoints

    for index, batch in enumerate(stream):
        if armed and index == at:
            deadline = time.monotonic() + 60
            while not (folder.is_dir() and complete_checkpoints(folder)) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: Sequence[int], within_s: float) -> list[int]:
    """The pids still alive after waiting up to ``within_s`` seconds for all to end."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]
