"""One rank of a distributed run: process group, stages, interpreter, results.

Used by both launchers: pipeweave's local spawner (:mod:`pipeweave.runtime.launch.processes`) and
torchrun (which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). gloo on CPU, NCCL on CUDA bound to the rank's GPU, gloo
through host memory where local ranks outnumber the GPUs (:mod:`pipeweave.devices`); every
collective and point-to-point wait has the job's timeout, so a dead peer turns into an error,
not a hang.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...devices import Placement, place
from ...host import threads_per_rank
from ...ir import Action
from ..advance.online import OnlineAdvance, run_rank_windows
from ..checkpoint.resume import Session
from ..communication.delay import delayed_transport
from ..communication.mesh import MeshTransport, lane_groups, pipeline_results
from ..communication.transport import DistTransport
from ..execution.features import OnStep, PositionHooks
from ..execution.stage import StageRuntime
from ..execution.ties import tie_groups
from ..observation.journal import StepJournal
from ..observation.progress import StepProgress
from ..observation.allocations import AllocationTracker
from ..observation.results import RankResult, attach_partial
from .assemble import AssembledRank, assemble_rank
from .faults import injected_fault_hooks
from .prepare import PreparedJob

if TYPE_CHECKING:
    from ..execution.tensor_parallel import RankMesh

__all__ = ["run_rank"]

StepHook = Callable[[Action, Mapping[int, StageRuntime]], None]


def run_rank(prepared: PreparedJob, *, rank: int, world_size: int, local_rank: int,
             local_world_size: int, init_method: str = "env://", gather: bool = False,
             store: dist.Store | None = None, journal: Path | None = None) -> list[RankResult]:
    """Run ``prepared`` as ``rank`` of ``world_size`` (rendezvous through ``store`` if given).

    Returns ``[this rank's result]``, or with ``gather`` every rank's results on rank 0 (and
    an empty list elsewhere). ``journal``: append what the rank has done to this file after
    every optimizer step (:mod:`..observation.journal`), for a launcher to read if the rank
    is killed.
    """
    rendezvous = {"store": store} if store is not None else {"init_method": init_method}
    placement = _join(prepared, rank=rank, world_size=world_size, local_rank=local_rank,
                      local_world_size=local_world_size, rendezvous=rendezvous)
    try:
        result = _run(prepared, rank, world_size, placement, journal)
        if not gather:
            dist.barrier(**placement.barrier_options())
            return [result]
        gathered: list[RankResult | None] = [None] * world_size if rank == 0 else []
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
        return pipeline_results([r for r in gathered if r is not None], prepared.job.plan.tp)
    finally:
        dist.destroy_process_group()


def _join(prepared: PreparedJob, *, rank: int, world_size: int, local_rank: int,
          local_world_size: int, rendezvous: dict[str, Any]) -> Placement:
    """Threads, seed and device of this process, and its process group."""
    job, schedule = prepared.job, prepared.schedule
    torch.set_num_threads(threads_per_rank(local_world_size))
    torch.manual_seed(job.seed)
    needed = schedule.num_ranks * job.plan.tp  # tp processes per pipeline rank
    if needed != world_size:
        raise ValueError(
            f"plan needs {needed} ranks but the run has world size {world_size}; "
            f"start {needed} processes (e.g. torchrun --nproc-per-node {needed})"
        )
    placement = place(job.device, local_rank=local_rank, local_ranks=local_world_size)
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
    timeout = datetime.timedelta(seconds=job.timeout_s)
    dist.init_process_group(placement.backend, **rendezvous, rank=rank, world_size=world_size,
                            timeout=timeout, **placement.group_options())
    return placement


def _run(prepared: PreparedJob, rank: int, world_size: int, placement: Placement,
         journal: Path | None) -> RankResult:
    """Build the rank, run its program and return its result (the process group is up)."""
    job, schedule, device = prepared.job, prepared.schedule, placement.device
    transport, mesh = _transport(prepared, rank, world_size, placement)
    process, rank = rank, transport.rank  # from here on, the pipeline rank of the schedule
    tracker = AllocationTracker(device) if job.track_allocations else None
    if tracker is not None:
        tracker.__enter__()
    assembled = assemble_rank(prepared, rank, device=device,
                              transport=delayed_transport(transport, rank),  # usually none
                              session=_agreed(prepared.session), group_of=transport.group,
                              mesh=mesh)
    origin = _common_origin(placement)
    progress = _progress_bar(prepared, rank) if process % job.plan.tp == 0 else None
    steps = None if journal is None else StepJournal(  # reads the final ``assembled`` below
        journal, lambda state: assembled.result(wall=time.time() - origin, device=device,
                                                final=False, losses=False, state=state),
        assembled.parts, window=4 * job.plan.microbatches)
    on_step = _each_step(progress, steps)
    assembled = assembled.with_timeline(origin, device).with_features(
        lambda r, program: [*([OnStep(on_step)] if on_step is not None else []),
                            PositionHooks(injected_fault_hooks(program, r))])
    online = assembled.online_advance()
    try:
        _interpret(assembled, online, transport, device)
    except BaseException as error:  # keep what ran: the losses and timeline so far
        with contextlib.suppress(Exception):  # never hide the error itself
            attach_partial(error, assembled.result(
                wall=time.time() - origin, device=device, final=False))
        raise
    finally:
        if steps is not None:
            steps.close()
    assembled.recovery.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if tracker is not None:
        tracker.__exit__(None, None, None)
    result = assembled.result(wall=time.time() - origin, device=device, online=online)
    if tracker is not None:
        result.peak_allocated_bytes = tracker.peak
    if progress is not None:
        progress.close()
    return result


def _transport(prepared: PreparedJob, process: int, world_size: int, placement: Placement
               ) -> tuple[DistTransport | MeshTransport, RankMesh | None]:
    """This process's transport, its process groups made, and its place in the
    ``(pp, dp, tp)`` mesh (None without tensor parallelism, where process = pipeline rank)."""
    job, schedule = prepared.job, prepared.schedule
    transport = DistTransport(process, placement.device, datetime.timedelta(seconds=job.timeout_s),
                              apc=job.apc, wire=placement.wire)
    groups = [*schedule.layout.stage_ranks,
              *([range(schedule.num_ranks)] if job.clip_grad_norm is not None else []),
              *tie_groups(prepared.ties, schedule.layout)]
    tp = job.plan.tp
    if tp == 1:
        transport.make_groups(groups)
        transport.track_deliveries(schedule)
        return transport, None
    from ..execution.tensor_parallel import make_rank_mesh  # DTensor loads only for tp runs

    transport.make_groups(lane_groups(groups, tp))
    mesh = make_rank_mesh(depth=job.plan.depth, width=job.plan.width, tp=tp, process=process,
                          device_type=placement.device.type)
    lanes = MeshTransport(transport, rank=mesh.rank, index=mesh.tp_index, tp=tp)
    lanes.track_deliveries(schedule)
    return lanes, mesh


def _interpret(assembled: AssembledRank, online: OnlineAdvance | None,
               transport: DistTransport | MeshTransport,
               device: torch.device) -> None:
    """The whole program, or AvgPipe's Algorithm 1: one iteration at a time
    (:mod:`..advance.online`)."""
    if online is None:
        for _ in assembled.interpreter().run():
            raise AssertionError("the distributed transport never yields")
    else:
        run_rank_windows(online, assembled.parts, assembled.interpreter, device=device,
                         before=transport.track_deliveries,
                         after=lambda done: assembled.end_window(online, done))


def _each_step(*hooks: StepHook | None) -> StepHook | None:
    """One ``on_step`` hook that calls each of ``hooks`` given (None if none is)."""
    given = [hook for hook in hooks if hook is not None]
    if not given:
        return None

    def on_step(action: Action, stages: Mapping[int, StageRuntime]) -> None:
        for hook in given:
            hook(action, stages)
    return on_step


def _agreed(session: Session | None) -> Session | None:
    """Rank 0's session on every rank (under torchrun each process prepared its own run id)."""
    if session is None:
        return None
    message: list[Session | None] = [session]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def _progress_bar(prepared: PreparedJob, rank: int) -> StepProgress | None:
    """The rank holding the last stage shows the bar (it knows the loss)."""
    job, schedule = prepared.job, prepared.schedule
    last = schedule.num_stages - 1
    if not job.progress or schedule.layout.stage_ranks[last][0] != rank:
        return None
    return StepProgress(total=job.steps, stage=last, microbatches=job.plan.microbatches)


def _common_origin(placement: Placement) -> float:
    """Rank 0's wall clock after a barrier, so all ranks' timelines share one zero."""
    dist.barrier(**placement.barrier_options())
    stamp = torch.tensor([time.time()], dtype=torch.float64, device=placement.wire)
    dist.broadcast(stamp, src=0)
    return float(stamp.item())
