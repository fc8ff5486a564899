"""Single-process executor: every rank's program interpreted in one process.

Each rank gets its own stages, optimizers and data source, exactly as in a distributed run;
messages go through in-memory mailboxes. The executor resumes rank generators round-robin;
a rank that waits for a message yields. Because every rank computes the same operations in
the same order on the same data as in the distributed run (all-reduces sum in replica order
in both), the numbers are identical — which makes semantics testable without processes.
Each rank also draws from its own random generator (swapped in whenever its program runs), as
it would in its own process, so dropout agrees too and a checkpoint can restore it per rank.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ...ir import Schedule, ScheduleError, render_grid
from ...host import threads_per_rank
from ..checkpoint.recovery import RankRecovery, check_checkpointable, check_resume, new_session
from ..execution.interpreter import RankInterpreter
from ..job import Job
from ..observation.memory import ActivationMeter
from ..execution.microbatches import MicrobatchSource
from ..averaging.online import OnlineAdvance, check_advance, run_local_windows
from ..observation.timeline import Recorder
from ..communication.transport import LocalTransport
from ..execution.parts import RankResult, attach_partial, build_rank, collect_result, make_schedule, preflight

__all__ = ["run_local"]


def run_local(job: Job) -> list[RankResult]:
    """Run ``job`` in this process; one :class:`RankResult` per rank.

    Uses the same intra-op thread count as one rank of a local distributed run, so that
    reductions inside kernels happen in the same order and results agree bit for bit.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank(job.plan.world_size))
    try:
        return _run(job)
    finally:
        torch.set_num_threads(threads)


def _run(job: Job) -> list[RankResult]:
    torch.manual_seed(job.seed)
    schedule = make_schedule(job.plan, job.steps)
    device = torch.device("cpu")
    spec = job.model()
    preflight(spec, job.plan, next(iter(job.data()))[0])
    check_advance(job, spec)
    check_checkpointable(job, schedule)
    stored = check_resume(job, spec)  # a bad checkpoint is reported before anything runs
    session = new_session(job.checkpoint, stored) if job.checkpoint is not None else None
    hub = LocalTransport(apc=job.apc)
    origin = time.time()
    parts, recoveries, endpoints, sources, recorders = [], [], [], [], []
    for rank in range(schedule.num_ranks):
        rank_parts = build_rank(job, rank, schedule, device, spec=spec)
        recovery = RankRecovery(job=job, schedule=schedule, rank=rank, parts=rank_parts,
                                device=device, session=session, apply_rng=False,
                                stored=stored)
        recoveries.append(recovery)
        sources.append(MicrobatchSource(recovery.positioned(job.data()),
                                        microbatches=job.plan.microbatches,
                                        pipelines=job.plan.pipelines,
                                        first_batch=recovery.first_batch))
        recorders.append(Recorder(rank, origin) if job.record_timeline else None)
        endpoints.append(hub.endpoint(rank))
        parts.append(rank_parts)

    def interpreter(rank: int, program: Schedule,
                    meter: ActivationMeter | None = None) -> RankInterpreter:
        whole = program is schedule
        return RankInterpreter(
            rank=rank, schedule=program, parts=parts[rank],
            transport=endpoints[rank], data=sources[rank], recorder=recorders[rank],
            start=recoveries[rank].start if whole else 0,
            after=recoveries[rank].hooks if whole else {}, meter=meter,
        )

    # Every rank draws from its own random generator, as it would in its own process.
    initial = torch.get_rng_state()
    rng = [r.rng_state if r.rng_state is not None else initial for r in recoveries]
    ranks = range(schedule.num_ranks)
    online = OnlineAdvance(job.plan, job.steps, job.advance) if job.advance is not None else None
    try:
        if online is None:
            _drive([interpreter(rank, schedule) for rank in ranks], rng, schedule)
        else:  # AvgPipe's Algorithm 1: one iteration at a time (runtime/averaging/online.py)
            run_local_windows(online, parts, lambda program, meters: _drive(
                [interpreter(rank, program, meters[rank]) for rank in ranks], rng, program))
    except BaseException as error:
        for recovery in recoveries:  # let pending writes finish; the first error is the one
            recovery.close(raise_errors=False)
        with contextlib.suppress(Exception):  # never hide the error itself
            attach_partial(error, *(
                collect_result(rank, parts[rank], schedule,
                               records=recorder.records if recorder is not None else [],
                               want_parameters=False, wall=time.time() - origin, device=device)
                for rank, recorder in enumerate(recorders)))
        raise
    for recovery in recoveries:
        recovery.close()
    wall = time.time() - origin
    results = [
        collect_result(rank, parts[rank], schedule,
                       records=recorder.records if recorder is not None else [],
                       want_parameters=job.return_parameters, wall=wall, device=device)
        for rank, recorder in enumerate(recorders)
    ]
    if online is not None:
        for result in results:
            result.advance_per_step, result.advance_log = online.advance_per_step, online.log
    for result, recovery, endpoint in zip(results, recoveries, endpoints):
        result.checkpoint_stall_s = recovery.stall_s
        result.bytes_sent = endpoint.bytes_sent
    return results


def _drive(interpreters: list[RankInterpreter], rng: list[torch.Tensor], schedule: Schedule) -> None:
    """Resume the ranks' programs round-robin until all end; ``rng`` (per rank) is updated."""
    running = {rank: interp.run() for rank, interp in enumerate(interpreters)}
    while running:
        progressed = False
        for rank in list(running):
            before = interpreters[rank].executed
            torch.set_rng_state(rng[rank])
            try:
                next(running[rank])
            except StopIteration:
                del running[rank]
                progressed = True
                continue
            rng[rank] = torch.get_rng_state()
            progressed = progressed or interpreters[rank].executed != before
        if running and not progressed:
            stuck = [(r, interpreters[r].executed) for r in sorted(running)]
            raise ScheduleError("single-process executor deadlocked:\n"
                                + render_grid(schedule, marked=stuck, max_columns=64))
