"""One rank of a distributed run: process group, stages, interpreter, results.

Used by both launchers: pipeweave's local spawner (:mod:`pipeweave.runtime.launch.processes`) and
torchrun (which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). gloo on CPU, NCCL on CUDA; every collective and
point-to-point wait has the job's timeout, so a dead peer turns into an error, not a hang.
"""

from __future__ import annotations

import contextlib
import datetime
import time

import torch
import torch.distributed as dist

from ...host import threads_per_rank
from ...ir import Schedule
from ..checkpoint.recovery import combine_hooks, distributed_recovery
from ..communication.delay import delayed_transport
from .faults import injected_fault_hooks
from ..execution.interpreter import RankInterpreter
from ..observation.memory import ActivationMeter
from ..averaging.online import OnlineAdvance, run_rank_windows
from ..observation.progress import StepProgress
from ..job import Job
from ..execution.microbatches import MicrobatchSource
from ..observation.timeline import Recorder
from ..communication.transport import DistTransport
from ..execution.parts import RankResult, attach_partial, build_rank, collect_result, make_schedule

__all__ = ["run_rank"]


def run_rank(job: Job, *, rank: int, world_size: int, local_rank: int, local_world_size: int,
             init_method: str = "env://", gather: bool = False,
             store: dist.Store | None = None) -> list[RankResult]:
    """Run ``job`` as ``rank`` of ``world_size`` (rendezvous through ``store`` if given).

    Returns ``[this rank's result]``, or with ``gather`` every rank's results on rank 0 (and
    an empty list elsewhere).
    """
    torch.set_num_threads(threads_per_rank(local_world_size))
    torch.manual_seed(job.seed)
    schedule = make_schedule(job.plan, job.steps)
    if schedule.num_ranks != world_size:
        raise ValueError(
            f"plan needs {schedule.num_ranks} ranks but the run has world size {world_size}; "
            f"start {schedule.num_ranks} processes (e.g. torchrun --nproc-per-node {schedule.num_ranks})"
        )
    if job.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    timeout = datetime.timedelta(seconds=job.timeout_s)
    rendezvous = {"store": store} if store is not None else {"init_method": init_method}
    dist.init_process_group(backend, **rendezvous, rank=rank, world_size=world_size,
                            timeout=timeout)
    try:
        transport = DistTransport(rank, device, timeout, apc=job.apc)
        transport.make_groups(schedule.layout.stage_ranks)
        transport.track_deliveries(schedule)
        parts = build_rank(job, rank, schedule, device)
        recovery = distributed_recovery(job, schedule, rank, parts, device)  # resume, checkpoints
        data = MicrobatchSource(recovery.positioned(job.data()), microbatches=job.plan.microbatches,
                                pipelines=job.plan.pipelines, device=device,
                                first_batch=recovery.first_batch)
        origin = _common_origin(device)
        recorder = Recorder(rank, origin) if job.record_timeline else None
        progress = _progress_bar(job, schedule, rank)
        wire = delayed_transport(transport, rank)  # PIPEWEAVE_INJECT_DELAY (usually none)

        def interpreter(program: Schedule, meter: ActivationMeter | None = None) -> RankInterpreter:
            hooks = recovery.hooks if program is schedule else {}
            return RankInterpreter(rank=rank, schedule=program, parts=parts, transport=wire,
                                   data=data, recorder=recorder, on_step=progress,
                                   start=recovery.start if program is schedule else 0,
                                   after=combine_hooks(hooks, injected_fault_hooks(program, rank)),
                                   meter=meter)

        online = (OnlineAdvance(job.plan, job.steps, job.advance) if job.advance is not None
                  else None)
        try:
            if online is None:
                for _ in interpreter(schedule).run():
                    raise AssertionError("the distributed transport never yields")
            else:  # AvgPipe's Algorithm 1: one iteration at a time (runtime/averaging/online.py)
                run_rank_windows(online, parts, interpreter, device=device,
                                 before=transport.track_deliveries)
        except BaseException as error:  # keep what ran: the losses and timeline so far
            with contextlib.suppress(Exception):  # never hide the error itself
                attach_partial(error, collect_result(
                    rank, parts, schedule, records=recorder.records if recorder else [],
                    want_parameters=False, wall=time.time() - origin, device=device))
            raise
        recovery.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.time() - origin
        result = collect_result(rank, parts, schedule,
                                records=recorder.records if recorder else [],
                                want_parameters=job.return_parameters, wall=wall, device=device)
        result.checkpoint_stall_s = recovery.stall_s
        if online is not None:
            result.advance_per_step, result.advance_log = online.advance_per_step, online.log
        result.bytes_sent = transport.bytes_sent
        if progress is not None:
            progress.close()
        if not gather:
            dist.barrier()
            return [result]
        gathered: list[RankResult | None] = [None] * world_size if rank == 0 else []
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
        return [r for r in gathered if r is not None]
    finally:
        dist.destroy_process_group()


def _progress_bar(job: Job, schedule: Schedule, rank: int) -> StepProgress | None:
    """The rank holding the last stage shows the bar (it knows the loss)."""
    last = schedule.num_stages - 1
    if not job.progress or schedule.layout.stage_ranks[last][0] != rank:
        return None
    return StepProgress(total=job.steps, stage=last, microbatches=job.plan.microbatches)


def _common_origin(device: torch.device) -> float:
    """Rank 0's wall clock after a barrier, so all ranks' timelines share one zero."""
    dist.barrier()
    stamp = torch.tensor([time.time()], dtype=torch.float64, device=device)
    dist.broadcast(stamp, src=0)
    return float(stamp.item())
