"""Launchers: pipeweave's own local spawner, and running under torchrun.

The local spawner starts one process per rank (``forkserver`` method), points them at a
free loopback port, and watches them: when one rank fails, the others are terminated at once
and :class:`RunFailed` carries the failing rank's traceback; nothing is left running. Results
come back through files in a private temporary folder (one pickle per rank, written
atomically by the rank and read once by the launcher that created the folder); while they
run, each rank also appends what it has done to a journal there after every optimizer step
(:mod:`..observation.journal`), so a failed, killed or interrupted run still reports every
step that completed. Ctrl-C stops the run cleanly at any moment (:mod:`.interrupts`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import traceback
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TextIO

import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from ..communication.mesh import pipeline_results
from ..job import Job
from ..observation.results import RankResult, attach_partial, partial_results
from ...devices import place
from ...host import FORKSERVER_PRELOAD
from .diagnosis import (ERROR_FILE, JOURNAL_FILE, PARTIAL_FILE, STDERR_FILE, USER_ERRORS,
                        RunFailed, RunInterrupted, diagnose, partials, rank_output)
from .faults import exit_with_launcher
from .interrupts import ctrl_c_deferred, listen_for_ctrl_c, start_forkserver_deaf
from .watch import first_failure, let_ranks_stop, stop_ranks
from .prepare import PreparedJob, prepare, prepared
from .rank import run_rank

__all__ = ["launch_local", "run_under_torchrun", "RunFailed", "RunInterrupted", "under_torchrun"]


LOOPBACK = "127.0.0.1"


class _LauncherStore:
    """The rendezvous store, hosted by the launcher on a socket it bound itself.

    ``init_method="tcp://127.0.0.1:port"`` would have rank 0 start a store that listens on
    every interface whatever host it is given; binding the listening socket here (to
    ``bind``, loopback by default) and handing it to ``TCPStore`` keeps it where it was asked
    to be, and holding it for the whole run leaves no window for another process to take the
    port.
    """

    def __init__(self, bind: str, timeout_s: float) -> None:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((bind, 0))
            listener.listen(128)
            self.host, self.port = bind, int(listener.getsockname()[1])
            self.store: dist.TCPStore | None = dist.TCPStore(
                bind, self.port, None, True, datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False, master_listen_fd=listener.fileno())
        except BaseException:
            listener.close()
            raise
        listener.detach()  # the store's server owns the descriptor now and closes it

    def close(self) -> None:
        self.store = None


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in ("lo", "lo0") if n in names), None)


def _spawned_rank(index: int, prepared_job: PreparedJob, world_size: int, store_address: tuple[str, int],
                  out_dir: str, launcher_pid: int) -> None:
    exit_with_launcher(launcher_pid)  # the launcher killed (even by SIGKILL): leave nothing behind
    sys.stderr = _divert_stderr(Path(out_dir) / STDERR_FILE.format(index))
    host, port = store_address
    if host == LOOPBACK and place(prepared_job.job.device, local_rank=index,  # gloo's own
                                  local_ranks=world_size).backend == "gloo":  # sockets too
        interface = loopback_interface()
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    # tqdm's default lock is a named semaphore shared through multiprocessing; a rank killed
    # while holding one leaks it, and the resource tracker warns about it on the terminal.
    # Only one rank shows a bar: a thread lock is enough.
    tqdm.set_lock(threading.RLock())
    try:
        listen_for_ctrl_c()  # from here on, a Ctrl-C stops this rank through the except below
        store = dist.TCPStore(host, port, None, False,
                              datetime.timedelta(seconds=prepared_job.job.timeout_s))
        (result,) = run_rank(prepared_job, rank=index, world_size=world_size, local_rank=index,
                             local_world_size=world_size, store=store,
                             journal=Path(out_dir) / JOURNAL_FILE.format(index))
    except BaseException as error:  # the launcher shows the cause in one line, logs the trace
        # stopping already: a second Ctrl-C (the terminal's and the launcher's) must not cut
        # this short, nor reach multiprocessing's bootstrap, which prints a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        partial = partial_results(error)  # and writes the outputs of what ran
        if partial:
            _write_pickle(Path(out_dir) / PARTIAL_FILE.format(index), partial)
        if isinstance(error, Exception):
            (Path(out_dir) / ERROR_FILE.format(index)).write_text(json.dumps({
                "type": type(error).__name__, "message": str(error).strip(),
                "user_error": isinstance(error, USER_ERRORS), "trace": traceback.format_exc()}))
        raise
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: the result is written whole
    _write_pickle(Path(out_dir) / f"rank{index}.pkl", result)


def _divert_stderr(path: Path) -> TextIO:
    """Send this process's file descriptor 2 to ``path``; return a stream to where it went
    before, to become ``sys.stderr``.

    What native code and torch's loggers write there (gloo's "Connection closed by peer",
    NCCL's and torch's C++ warnings) is noise when a peer has died or the run was stopped:
    the launcher puts it in the run's log (:func:`.diagnosis.rank_output`). Python's own
    writes, the progress bar and warnings, stay on the terminal.
    """
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    return terminal


def _write_pickle(path: Path, value: object) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(value, handle)
    os.replace(tmp, path)


def launch_local(job: Job | PreparedJob, *, deadline_s: float | None = None,
                 bind: str = LOOPBACK) -> list[RankResult]:
    """Run ``job`` on ``plan.processes`` local processes; one result per pipeline rank (with
    ``Plan.tp``, tensor-parallel index 0's).

    The rendezvous store listens on ``bind`` only (loopback by default; another address of
    this machine opens it to other hosts), and on loopback gloo's sockets stay there too.

    Raises :class:`RunFailed` if any rank fails (the others are terminated), or if the whole
    run exceeds ``deadline_s`` seconds; :class:`RunInterrupted` on Ctrl-C. Either carries what
    the ranks had done (:func:`~..observation.results.partial_results`).
    """
    ready = prepared(job)  # every check, before any rank starts
    world_size = ready.schedule.num_ranks * ready.job.plan.tp  # tp processes per rank
    # forkserver: the server imports torch once (no kernels run there, so no thread pools
    # exist to break by forking); each launch then forks ranks in milliseconds instead of
    # re-importing torch in every fresh interpreter as ``spawn`` does (FORKSERVER_PRELOAD).
    mp.set_forkserver_preload([*FORKSERVER_PRELOAD, "pipeweave.runtime.launch.rank"])
    start_forkserver_deaf()
    rendezvous = _LauncherStore(bind, ready.job.timeout_s)
    with tempfile.TemporaryDirectory(prefix="pipeweave-") as folder:
        failure = _run_ranks(ready, world_size, rendezvous, folder, deadline_s)
        return pipeline_results(_results(Path(folder), world_size, failure), ready.job.plan.tp)


def _run_ranks(ready: PreparedJob, world_size: int, rendezvous: _LauncherStore, folder: str,
               deadline_s: float | None) -> RunFailed | None:
    """Start every rank and watch them until all end: the failure, or None when none failed;
    every rank is stopped and the rendezvous store closed before it returns."""
    processes: list[BaseProcess] = []
    error_files: list[str] = []
    failure: RunFailed | None = None
    try:
        with ctrl_c_deferred():  # not between two starts: every started rank is known
            context = mp.start_processes(
                _spawned_rank,
                args=(ready, world_size, (rendezvous.host, rendezvous.port), folder,
                      os.getpid()),
                nprocs=world_size, join=False, start_method="forkserver")
            processes, error_files = list(context.processes), list(context.error_files)
        failed = first_failure(processes, deadline_s)
        if failed is not None:
            failure = diagnose(Path(folder), processes, error_files, failed)
    except KeyboardInterrupt:
        let_ranks_stop(processes)
        failure = RunInterrupted("interrupted (Ctrl-C); all ranks were stopped",
                                 cause="interrupted (Ctrl-C)",
                                 trace="the launcher got a Ctrl-C (SIGINT) and stopped "
                                       "every rank\n")
    except TimeoutError as error:
        failure = RunFailed(str(error))
    finally:
        stop_ranks(processes)
        rendezvous.close()
        for name in error_files:  # torch's, outside our folder
            with contextlib.suppress(OSError):
                os.unlink(name)
    return failure


def _results(out_dir: Path, world_size: int, failure: RunFailed | None) -> list[RankResult]:
    """Every rank's result from ``out_dir``; raises ``failure`` (or the interruption that
    left a rank without a result) with what the ranks had done and printed."""
    missing = [r for r in range(world_size) if not (out_dir / f"rank{r}.pkl").exists()]
    if failure is None and missing:  # e.g. the ranks took a Ctrl-C the launcher did not see
        failure = RunInterrupted(f"ranks {missing} stopped without a result",
                                 cause="interrupted (Ctrl-C)")
    output = rank_output(out_dir)
    if failure is not None:
        attach_partial(failure, *partials(out_dir))
        failure.trace = "\n".join(part for part in (failure.trace, output) if part)
        raise failure
    if output:  # a run that went well: its warnings, late but not lost
        print(output, file=sys.stderr, end="")
    results = []
    for rank in range(world_size):
        with open(out_dir / f"rank{rank}.pkl", "rb") as handle:
            results.append(pickle.load(handle))
    return results


def under_torchrun() -> bool:
    """True when the usual torchrun environment variables are present."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_under_torchrun(job: Job | PreparedJob) -> list[RankResult]:
    """Run this process's rank as torchrun set it up; rank 0 gets every rank's result.

    Every process prepares the job itself (there is no parent); only rank 0 hashes the
    checkpoint to resume, and every rank uses rank 0's session."""
    rank = int(os.environ["RANK"])
    ready = job if isinstance(job, PreparedJob) else prepare(job, verify_checksums=rank == 0)
    return run_rank(
        ready, rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        gather=True, store=restart_safe_store(ready.job.timeout_s),
    )


def restart_safe_store(timeout_s: float) -> dist.Store | None:
    """Under torchrun, the agent's store with a key prefix per restart attempt (or None).

    torchrun lets workers share its own TCPStore (``TORCHELASTIC_USE_AGENT_STORE``). After a
    ``--max-restarts`` restart the previous attempt's keys are still there, and a new worker
    can read a dead peer's gloo address and fail with "connection refused" (pytorch/pytorch
    issue 135712); a prefix per attempt (``TORCHELASTIC_RESTART_COUNT``) keeps them apart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # rank 0 hosts a fresh store for every attempt
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    if nodes > 1 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        # Each node's agent counts its own restarts (a node whose workers only saw a peer leave
        # restarts without counting), so the attempt number differs between nodes and cannot
        # keep the attempts' keys apart in the store the agents share.
        raise ValueError(
            f"torchrun on {nodes} nodes with --max-restarts "
            f"{os.environ['TORCHELASTIC_MAX_RESTARTS']} shares one store across restarts, where "
            f"a restarted rank can read a dead peer's address (pytorch/pytorch issue 135712); "
            f"set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for every torchrun (a fresh store per "
            f"restart; examples/slurm_train.sh does), or run without --max-restarts")
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           int(os.environ["WORLD_SIZE"]), False,
                           timeout=datetime.timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"pipeweave/attempt-{attempt}/", client)
