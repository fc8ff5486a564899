"""The PyTorch side of ``vs_torch_pipelining.py`` and ``zero_bubble.py``: one rank of
torch.distributed.pipelining.

Every rank builds the same pipeweave model (``pipeweave.models.build_model``), keeps a deep
copy of each of its stages' blocks as an ``nn.Sequential`` (exactly what pipeweave's
``build_rank`` does), wraps each in a ``PipelineStage`` (global stage index, total stage
count) and drives one of torch's schedules (:data:`TORCH_SCHEDULES`) for ``steps``
iterations on the same batches pipeweave reads (batch ``k`` of the dataset stream for
iteration ``k``). It records when each iteration ended (wall clock after the optimizer step,
on a time axis shared by all ranks), the loss of every micro-batch and the peak RSS.

One stage per rank (``chunks=1``) gives ``ScheduleGPipe`` / ``Schedule1F1B`` a single stage,
as ``vs_torch_pipelining.py`` always has. With ``chunks=2`` a rank holds two stages, placed
as torch's multi-stage schedules expect::

    placement "loop" (interleaved)   rank r: stages r, r+P       P=2: ranks 0 1 0 1
    placement "v"    (ZBV, DualPipeV) rank r: stages r, 2P-1-r   P=2: ranks 0 1 1 0

and the schedule gets the list of the rank's stages. ``step()`` gets the batch on the rank
holding stage 0 and the targets (and a list for the losses) on the rank holding the last
stage; with the V that is rank 0 for both.

**Meshes** (``vs_torch_mesh.py``): with ``dp > 1`` or ``tp > 1`` the processes form
``init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))`` (process
``(p*dp + k)*tp + t`` at ``(p, k, t)``). Each stage's module is split over ``tp`` with
pipeweave's own parallelize plan (``parallelize_stage``: torch's ``parallelize_module`` with
the column/row styles docs/sharding.md lists), then held over ``dp`` as torchtitan holds it:
``shard="full"`` / ``"grad-op"`` wrap every block with parameters, then the stage, with
``fully_shard`` (``reshard_after_forward`` True / False); ``"none"`` wraps the stage with
``replicate`` (``torch.distributed._composable.replicate_with_fsdp``, FSDP2's replicated
twin, which ``PipelineStage`` knows). ``PipelineStage`` talks over the ``pp`` sub-mesh's group.
Copy ``k`` trains micro-batches ``k, k+dp, ...`` of every batch (:func:`copy_rows`), as
pipeweave's width deals them, so the global batch, the micro-batch size and the gradient (the
mean over the batch: torch scales by its ``M/dp`` micro-batches, FSDP2 averages over ``dp``)
are pipeweave's.

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

__all__ = ["TorchSide", "TorchRankResult", "TORCH_SCHEDULES", "PLACEMENTS", "SHARDS", "launch",
           "copy_rows"]

TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
"""Names this worker runs -> the class in ``torch.distributed.pipelining`` (looked up when a
rank starts, so a class this torch lacks fails that run with a clear error, not the import)."""

PLACEMENTS = ("loop", "v")
"""How a rank's chunks sit (module docstring); ``"loop"`` with one chunk is a straight pipeline."""

SHARDS = ("none", "full", "grad-op")
"""How a stage is held over ``dp`` (module docstring), as pipeweave's ``--shard``."""


@dataclass(frozen=True)
class TorchSide:
    """One torch.distributed.pipelining run, as plain picklable data."""

    model: str
    overrides: dict[str, Any]
    stages: tuple[tuple[int, int], ...]
    """``[start, end)`` block range of every stage, in pipeline order (``ranks x chunks``)."""
    schedule: str
    """A key of :data:`TORCH_SCHEDULES` (``"gpipe"``, ``"1f1b"``, ``"zbv"``, ...)."""
    microbatches: int
    batch_size: int
    seq_len: int | None
    dataset: str
    steps: int
    lr: float
    seed: int = 0
    timeout_s: float = 120.0
    chunks: int = 1
    """Stages per rank: 1 for GPipe/1F1B, 2 for the interleaved and V schedules."""
    placement: str = "loop"
    """Where a rank's chunks sit (module docstring): ``"loop"`` or ``"v"`` (two chunks)."""
    dp: int = 1
    """Data-parallel copies of the pipeline (the mesh's ``dp``)."""
    shard: str = "none"
    """With ``dp > 1``: ``"none"`` (replicate), ``"full"`` or ``"grad-op"`` (fully_shard)."""
    tp: int = 1
    """Tensor-parallel processes per pipeline rank (the mesh's ``tp``)."""

    def __post_init__(self) -> None:
        if self.shard not in SHARDS:
            raise ValueError(f"shard {self.shard!r}: use one of {list(SHARDS)}")
        if self.dp < 1 or self.tp < 1 or self.microbatches % self.dp:
            raise ValueError(f"dp={self.dp}, tp={self.tp}, microbatches={self.microbatches}: "
                             f"dp and tp >= 1 and dp must divide the micro-batches")
        if self.shard != "none" and self.dp == 1:
            raise ValueError(f"shard {self.shard!r} with dp=1 has nothing to shard over; "
                             f"give dp >= 2 or shard 'none'")
        if self.schedule not in TORCH_SCHEDULES:
            raise ValueError(f"torch side runs schedules {sorted(TORCH_SCHEDULES)}, "
                             f"not {self.schedule!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}: use one of {list(PLACEMENTS)}")
        if self.chunks < 1 or len(self.stages) % self.chunks:
            raise ValueError(f"{len(self.stages)} stages cannot be dealt {self.chunks} per rank; "
                             f"give ranks x chunks stages")
        if self.placement == "v" and self.chunks != 2:
            raise ValueError(f"the V places two chunks per rank, got chunks={self.chunks}")

    @property
    def ranks(self) -> int:
        """Pipeline ranks of one copy (the mesh's ``pp``)."""
        return len(self.stages) // self.chunks

    @property
    def processes(self) -> int:
        return self.ranks * self.dp * self.tp

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Global indices of the stages ``rank`` holds, in stage order."""
        count = len(self.stages)
        if self.placement == "v":
            return (rank, count - 1 - rank)
        return tuple(range(rank, count, self.ranks))


@dataclass
class TorchRankResult:
    rank: int
    iteration_end_s: list[float] = field(default_factory=list)
    """Wall time (since the shared origin) when this rank finished iteration k."""
    losses: list[float] = field(default_factory=list)
    """Mean loss of each iteration (the rank holding the last stage only): the mean of its
    micro-batch losses."""
    peak_memory_bytes: int = 0


def _schedule_class(name: str) -> type:
    import torch.distributed.pipelining as pipelining

    class_name = TORCH_SCHEDULES[name]
    found = getattr(pipelining, class_name, None)
    if found is None:
        raise NotImplementedError(f"torch {torch.__version__} has no "
                                  f"torch.distributed.pipelining.{class_name}")
    return found


def copy_rows(tensor: torch.Tensor, microbatches: int, dp: int, copy: int) -> torch.Tensor:
    """The rows of ``tensor`` (a whole batch) that copy ``copy`` of ``dp`` trains: micro-batches
    ``copy, copy + dp, ...`` of ``microbatches`` row blocks, in that order (pipeweave's width
    deals a batch's micro-batches to its copies so)."""
    if dp == 1:
        return tensor
    blocks = torch.tensor_split(tensor, microbatches)
    return torch.cat(blocks[copy::dp])


def _coordinates(side: TorchSide, rank: int) -> tuple[int, int, Any]:
    """``rank``'s pipeline rank, its copy and the ``(pp, dp, tp)`` mesh (None: no mesh)."""
    if side.dp * side.tp == 1:
        return rank, 0, None
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (side.ranks, side.dp, side.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    pipeline = rank // side.tp
    return pipeline // side.dp, pipeline % side.dp, mesh


def _hold(module: nn.Module, side: TorchSide, mesh: Any) -> None:
    """Split ``module`` over ``tp`` and hold it over ``dp`` (module docstring), in place."""
    if mesh is None:
        return
    if side.tp > 1:
        from pipeweave.runtime.execution.tensor_parallel import parallelize_stage

        parallelize_stage(module, mesh["tp"])
    if side.dp == 1:
        return
    if side.shard == "none":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(module, mesh=mesh["dp"])
        return
    from torch.distributed.fsdp import fully_shard

    reshard = side.shard == "full"
    for block in module.children():
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh["dp"], reshard_after_forward=reshard)


def _build_stages(side: TorchSide,
                  rank: int) -> tuple[list[Any], list[nn.Sequential], Any, int, tuple[int, ...]]:
    """The rank's PipelineStages, their modules, the model spec, its copy and the global
    indices of the stages it holds."""
    from torch.distributed.pipelining import PipelineStage

    from pipeweave.models import build_model

    pipeline, copy_index, mesh = _coordinates(side, rank)
    spec = build_model(side.model, seed=side.seed, **side.overrides)
    held = side.stages_of(pipeline)
    modules = [nn.Sequential(*copy.deepcopy(list(spec.blocks[slice(*side.stages[s])])))
               for s in held]
    for module in modules:
        _hold(module, side, mesh)
    group = mesh["pp"].get_group() if mesh is not None else None
    stages = [PipelineStage(module, s, len(side.stages), torch.device("cpu"), group=group)
              for s, module in zip(held, modules)]
    return stages, modules, spec, copy_index, held


def run_rank(side: TorchSide, rank: int, world_size: int, init_method: str) -> TorchRankResult:
    """Train ``side.steps`` iterations as ``rank``; return its timings, losses and memory."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from pipeweave.data import build_dataset

    torch.set_num_threads(1)  # one core per rank, as pipeweave's threads_per_rank gives here
    torch.manual_seed(side.seed)
    timeout = datetime.timedelta(seconds=side.timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timeout)
    try:
        stages, modules, spec, copy_index, held = _build_stages(side, rank)
        schedule_class = _schedule_class(side.schedule)
        single = issubclass(schedule_class, PipelineScheduleSingle)
        if single and len(stages) != 1:
            raise ValueError(f"{schedule_class.__name__} runs one stage per rank, got "
                             f"chunks={side.chunks}")
        # loss_fn on every rank (only the last stage calls it; without it the others hang).
        schedule = schedule_class(stages[0] if single else stages,
                                  side.microbatches // side.dp, loss_fn=spec.loss_fn)
        optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=side.lr)
        stream = iter(build_dataset(side.dataset, batch_size=side.batch_size,
                                    seq_len=side.seq_len, seed=side.seed))
        dist.barrier()
        stamp = torch.tensor([time.time()], dtype=torch.float64)
        dist.broadcast(stamp, src=0)
        origin = float(stamp.item())
        result = TorchRankResult(rank=rank)
        has_first, has_last = 0 in held, len(side.stages) - 1 in held
        for _ in range(side.steps):
            # contiguous: the stream's inputs are a slice of (batch, seq + 1) token rows, and
            # torch 2.11's PipelineStage refuses their strides (2.13 accepts them)
            inputs, targets = (copy_rows(t, side.microbatches, side.dp, copy_index).contiguous()
                               for t in next(stream))
            args = (inputs,) if has_first else ()
            if has_last:
                losses: list[torch.Tensor] = []
                schedule.step(*args, target=targets, losses=losses, return_outputs=False)
                result.losses.append(float(torch.stack(losses).detach().mean()))
            else:
                schedule.step(*args)
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
    """One ``forkserver`` process per rank on a loopback port; one result per rank."""
    from pipeweave.host import free_port

    world_size = side.processes
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
