"""Single-process executor: every rank's program interpreted in one process.

Each rank gets its own stages, optimizers and data source, exactly as in a distributed run;
messages go through in-memory mailboxes. The executor resumes rank generators round-robin;
a rank that waits for a message yields. Because every rank computes the same operations in
the same order on the same data as in the distributed run (all-reduces sum in replica order
in both), the numbers are identical — which makes semantics testable without processes.
Each rank also draws from its own random generator (swapped in whenever its program runs), as
it would in its own process, so dropout agrees too and a checkpoint can restore it per rank.
Everything runs on the job's device: with ``cuda``, every rank's stages on ``cuda:0``
(:func:`pipeweave.devices.place`); there the ranks share one CUDA generator, so with dropout
the numbers differ from a distributed run's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch

from ..observation.memory import ActivationMeter
from ...devices import place
from ...host import threads_per_rank
from ...ir import Schedule, ScheduleError, render_grid
from ..advance.online import run_local_windows
from ..communication.transport import LocalTransport
from ..execution.interpreter import RankInterpreter
from ..job import Job
from ..observation.results import RankResult, attach_partial
from .assemble import AssembledRank, FeatureFactory, assemble_rank
from .prepare import PreparedJob, prepare

__all__ = ["run_local"]


def run_local(job: Job | PreparedJob, *,
              features: FeatureFactory | None = None) -> list[RankResult]:
    """Run ``job`` in this process; one :class:`RankResult` per rank.

    ``features``: ``(rank, program) -> rank features`` added to every rank's interpreter
    (:mod:`..execution.features`), e.g. a meter of one's own.

    Uses the same intra-op thread count as one rank of a local distributed run, so that
    reductions inside kernels happen in the same order and results agree bit for bit. Every
    stage trains in train mode, whatever mode the model's blocks came in, as in
    ``launch_local`` (a ``from_pretrained`` model comes in eval mode; its dropout is on).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank(job.plan.world_size if isinstance(job, Job)
                                           else job.job.plan.world_size))
    try:
        return _run(job, features)
    finally:
        torch.set_num_threads(threads)


def _refuse_what_needs_processes(job: Job) -> None:
    """One line for each option that needs a process per rank."""
    if job.track_allocations:
        raise ValueError("track_allocations measures each rank's tensors in its own process; "
                         "the single-process executor runs every rank in one: launch the job "
                         "with launch_local (--executor processes)")
    if job.plan.shard != "none":
        raise ValueError(f"--shard {job.plan.shard} shards each stage over its ranks' own "
                         f"process group; the single-process executor has none: use "
                         f"--executor processes (launch_local), or --shard none")
    if job.plan.tp > 1:
        raise ValueError(f"tp={job.plan.tp} splits each stage over {job.plan.tp} processes; the "
                         f"single-process executor has one: use --executor processes "
                         f"(launch_local), or tp=1")


def _run(given: Job | PreparedJob, features: FeatureFactory | None) -> list[RankResult]:
    job = given if isinstance(given, Job) else given.job
    _refuse_what_needs_processes(job)
    torch.manual_seed(job.seed)
    spec = job.model()
    prepared = given if isinstance(given, PreparedJob) else prepare(job, spec=spec)
    schedule = prepared.schedule
    device = place(job.device, local_rank=0, local_ranks=1).device  # every rank on it
    hub = LocalTransport(apc=job.apc)
    origin = time.time()
    ranks: list[AssembledRank] = []
    for rank in range(schedule.num_ranks):
        assembled = assemble_rank(prepared, rank, device=device, transport=hub.endpoint(rank),
                                  session=prepared.session, spec=spec, apply_rng=False)
        assembled = assembled.with_timeline(origin, device)
        ranks.append(assembled if features is None else assembled.with_features(features))

    def interpreters(program: Schedule | None = None,
                     meters: Sequence[ActivationMeter | None] | None = None) -> list[RankInterpreter]:
        return [r.interpreter(program, None if meters is None else meters[r.rank]) for r in ranks]

    # Every rank draws from its own random generator, as it would in its own process.
    initial = torch.get_rng_state()
    rng = [r.recovery.rng_state if r.recovery.rng_state is not None else initial for r in ranks]
    online = ranks[0].online_advance()

    def end_window(steps_done: int) -> None:
        assert online is not None
        for r in ranks:  # each rank's checkpoint holds its own random generator's state
            torch.set_rng_state(rng[r.rank])
            r.end_window(online, steps_done)

    try:
        if online is None:
            _drive(interpreters(), rng, schedule)
        else:  # AvgPipe's Algorithm 1: one iteration at a time (runtime/advance/online.py)
            run_local_windows(online, [r.parts for r in ranks], lambda program, meters: _drive(
                interpreters(program, meters), rng, program), after=end_window)
    except BaseException as error:
        for r in ranks:  # let pending writes finish; the first error is the one
            r.recovery.close(raise_errors=False)
        with contextlib.suppress(Exception):  # never hide the error itself
            attach_partial(error, *(r.result(wall=time.time() - origin, device=device, final=False)
                                    for r in ranks))
        raise
    for r in ranks:
        r.recovery.close()
    wall = time.time() - origin
    return [r.result(wall=wall, device=device, online=online)
            for r in ranks]


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
            except StopIteration:  # its last actions may have drawn too (a window's end)
                rng[rank] = torch.get_rng_state()
                del running[rank]
                progressed = True
                continue
            rng[rank] = torch.get_rng_state()
            progressed = progressed or interpreters[rank].executed != before
        if running and not progressed:
            stuck = [(r, interpreters[r].executed) for r in sorted(running)]
            raise ScheduleError("single-process executor deadlocked:\n"
                                + render_grid(schedule, marked=stuck, max_columns=64))
