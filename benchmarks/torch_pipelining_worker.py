"""The PyTorch side of ``vs_torch_pipelining.py``: one rank of torch.distributed.pipelining.

Every rank builds the same pipeweave model (``pipeweave.models.build_model``), keeps a deep
copy of its stage's blocks as an ``nn.Sequential`` (exactly what pipeweave's ``build_rank``
does), wraps it in a ``PipelineStage`` and drives ``ScheduleGPipe`` or ``Schedule1F1B`` for
``steps`` iterations on the same batches pipeweave reads (batch ``k`` of the dataset stream
for iteration ``k``). It records when each iteration ended (wall clock after the optimizer
step, on a time axis shared by all ranks), the loss of every micro-batch and the peak RSS.

:func:`launch` starts one process per rank the way pipeweave's ``launch_local`` does:
``forkserver`` processes that meet on a free loopback port over gloo, results returned as
pickles, startup outside the timed window.
"""

from __future__ import annotations

import copy
import datetime
import os
import pickle
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

__all__ = ["TorchSide", "TorchRankResult", "launch"]


@dataclass(frozen=True)
class TorchSide:
    """One torch.distributed.pipelining run, as plain picklable data."""

    model: str
    overrides: dict[str, Any]
    stages: tuple[tuple[int, int], ...]
    """``[start, end)`` block range per stage (one stage per rank)."""
    schedule: str
    """``"gpipe"`` or ``"1f1b"``."""
    microbatches: int
    batch_size: int
    seq_len: int | None
    dataset: str
    steps: int
    lr: float
    seed: int = 0
    timeout_s: float = 120.0


@dataclass
class TorchRankResult:
    rank: int
    iteration_end_s: list[float] = field(default_factory=list)
    """Wall time (since the shared origin) when this rank finished iteration k."""
    losses: list[float] = field(default_factory=list)
    """Mean loss of each iteration (last rank only): the mean of its micro-batch losses."""
    peak_memory_bytes: int = 0


def _schedule_class(name: str) -> type:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if name not in classes:
        raise ValueError(f"torch side runs schedules {sorted(classes)}, not {name!r}")
    return classes[name]


def run_rank(side: TorchSide, rank: int, world_size: int, init_method: str) -> TorchRankResult:
    """Train ``side.steps`` iterations as ``rank``; return its timings, losses and memory."""
    from torch.distributed.pipelining import PipelineStage

    from pipeweave.data import build_dataset
    from pipeweave.models import build_model

    torch.set_num_threads(1)  # one core per rank, as pipeweave's threads_per_rank gives here
    torch.manual_seed(side.seed)
    timeout = datetime.timedelta(seconds=side.timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timeout)
    try:
        spec = build_model(side.model, seed=side.seed, **side.overrides)
        start, end = side.stages[rank]
        module = nn.Sequential(*copy.deepcopy(list(spec.blocks[start:end])))
        stage = PipelineStage(module, rank, world_size, torch.device("cpu"))
        # loss_fn on every rank (only the last one calls it; without it the others hang).
        schedule = _schedule_class(side.schedule)(stage, side.microbatches, loss_fn=spec.loss_fn)
        optimizer = torch.optim.SGD(module.parameters(), lr=side.lr)
        stream = iter(build_dataset(side.dataset, batch_size=side.batch_size,
                                    seq_len=side.seq_len, seed=side.seed))
        dist.barrier()
        stamp = torch.tensor([time.time()], dtype=torch.float64)
        dist.broadcast(stamp, src=0)
        origin = float(stamp.item())
        result = TorchRankResult(rank=rank)
        is_last = rank == world_size - 1
        for _ in range(side.steps):
            inputs, targets = next(stream)
            if rank == 0:
                schedule.step(inputs)
            elif is_last:
                losses: list[torch.Tensor] = []
                schedule.step(target=targets, losses=losses, return_outputs=False)
                result.losses.append(float(torch.stack(losses).detach().mean()))
            else:
                schedule.step()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.iteration_end_s.append(time.time() - origin)
        result.peak_memory_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _spawned(index: int, side: TorchSide, world_size: int, init_method: str, out_dir: str) -> None:
    result = run_rank(side, index, world_size, init_method)
    path = Path(out_dir) / f"rank{index}.pkl"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(result, handle)
    os.replace(tmp, path)


def launch(side: TorchSide) -> list[TorchRankResult]:
    """One ``forkserver`` process per stage on a loopback port; one result per rank."""
    from pipeweave.host import free_port

    world_size = len(side.stages)
    mp.set_forkserver_preload(["torch", "pipeweave.runtime.launch.rank"])
    init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="torch-pp-") as out_dir:
        context = mp.start_processes(_spawned, args=(side, world_size, init_method, out_dir),
                                     nprocs=world_size, join=False, start_method="forkserver")
        try:
            while not context.join(timeout=0.5):
                pass
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                process.join(timeout=10)
        results = []
        for rank in range(world_size):
            with open(Path(out_dir) / f"rank{rank}.pkl", "rb") as handle:
                results.append(pickle.load(handle))
        return results
