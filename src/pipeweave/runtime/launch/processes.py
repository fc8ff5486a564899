"""Launchers: pipeweave's own local spawner, and running under torchrun.

The local spawner starts one process per rank (``forkserver`` method), points them at a
free loopback port, and watches them: when one rank fails, the others are terminated at once
and :class:`RunFailed` carries the failing rank's traceback; nothing is left running. Results
come back through files in a private temporary folder (one pickle per rank, written
atomically by the rank and read once by the launcher that created the folder).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from ..job import Job
from ..observation.results import RankResult, attach_partial, partial_results
from ...devices import place
from .faults import exit_with_launcher
from .prepare import PreparedJob, prepare, prepared
from .rank import run_rank

__all__ = ["launch_local", "run_under_torchrun", "RunFailed", "RunInterrupted", "under_torchrun"]


class RunFailed(RuntimeError):
    """A rank failed; the message names it and includes its error.

    ``rank``, ``cause`` (the error's one-line message, without its type) and ``trace`` (the
    failing rank's traceback) are kept apart for front ends that show one line and log the
    rest (``pipeweave train``).
    """

    def __init__(self, message: str, *, rank: int | None = None, cause: str | None = None,
                 trace: str = "", partial: list[RankResult] | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.cause = cause if cause is not None else message.splitlines()[0]
        self.trace = trace
        attach_partial(self, *(partial or []))


class RunInterrupted(RunFailed):
    """The run was interrupted (Ctrl-C); what the ranks had done comes with it."""


_ERROR_FILE = "rank{}.error.json"
_PARTIAL_FILE = "rank{}.partial.pkl"
_USER_ERRORS = (ValueError, ArithmeticError, LookupError, TypeError, OSError)
"""Error types that report a bad input or a diverging run rather than a lost peer; when
several ranks fail at once, one of these is the cause to show."""


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
    host, port = store_address
    if host == LOOPBACK and place(prepared_job.job.device, local_rank=index,  # gloo's own
                                  local_ranks=world_size).backend == "gloo":  # sockets too
        interface = loopback_interface()
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    try:
        store = dist.TCPStore(host, port, None, False,
                              datetime.timedelta(seconds=prepared_job.job.timeout_s))
        (result,) = run_rank(prepared_job, rank=index, world_size=world_size, local_rank=index,
                             local_world_size=world_size, store=store)
    except BaseException as error:  # the launcher shows the cause in one line, logs the trace
        partial = partial_results(error)  # and writes the outputs of what ran
        if partial:
            _write_pickle(Path(out_dir) / _PARTIAL_FILE.format(index), partial)
        if isinstance(error, Exception):
            (Path(out_dir) / _ERROR_FILE.format(index)).write_text(json.dumps({
                "type": type(error).__name__, "message": str(error).strip(),
                "user_error": isinstance(error, _USER_ERRORS), "trace": traceback.format_exc()}))
        raise
    _write_pickle(Path(out_dir) / f"rank{index}.pkl", result)


def _write_pickle(path: Path, value: object) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(value, handle)
    os.replace(tmp, path)


def _file_rank(path: Path) -> int:
    """The rank a ``rank{N}.*`` file of the results folder belongs to."""
    return int(path.name[4:].split(".")[0])


def _partials(out_dir: Path) -> list[RankResult]:
    """What failed or interrupted ranks had done (:func:`attach_partial`), by rank."""
    found: list[RankResult] = []
    # by rank number: sorting the names would put rank10 before rank2
    for path in sorted(out_dir.glob(_PARTIAL_FILE.format("*")), key=_file_rank):
        try:
            with open(path, "rb") as handle:
                found.extend(pickle.load(handle))
        except (OSError, pickle.UnpicklingError, EOFError):
            continue
    return found


def launch_local(job: Job | PreparedJob, *, deadline_s: float | None = None,
                 bind: str = LOOPBACK) -> list[RankResult]:
    """Run ``job`` on ``plan.world_size`` local processes; one result per rank.

    The rendezvous store listens on ``bind`` only (loopback by default; another address of
    this machine opens it to other hosts), and on loopback gloo's sockets stay there too.

    Raises :class:`RunFailed` if any rank fails (the others are terminated), or if the whole
    run exceeds ``deadline_s`` seconds.
    """
    ready = prepared(job)  # every check, before any rank starts
    world_size = ready.schedule.num_ranks
    # forkserver: the server imports torch once (no kernels run there, so no thread pools
    # exist to break by forking); each launch then forks ranks in milliseconds instead of
    # re-importing torch in every fresh interpreter as ``spawn`` does.
    mp.set_forkserver_preload(["torch", "pipeweave.runtime.launch.rank"])
    rendezvous = _LauncherStore(bind, ready.job.timeout_s)
    with tempfile.TemporaryDirectory(prefix="pipeweave-") as out_dir:
        context = mp.start_processes(
            _spawned_rank,
            args=(ready, world_size, (rendezvous.host, rendezvous.port), out_dir, os.getpid()),
            nprocs=world_size,
            join=False, start_method="forkserver",
        )
        started = time.monotonic()
        try:
            while not context.join(timeout=0.5):
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    raise RunFailed(f"run exceeded its deadline of {deadline_s:.0f} s; stopped all ranks")
        except mp.ProcessRaisedException as error:
            rank, cause, trace = _root_cause(Path(out_dir), error.error_index, str(error).strip())
            raise RunFailed(f"rank {rank} failed: {cause}\n"
                            f"all other ranks were stopped; the failing rank's traceback:\n{trace}",
                            rank=rank, cause=cause, trace=trace,
                            partial=_partials(Path(out_dir))) from None
        except mp.ProcessExitedException as error:
            raise RunFailed(
                f"rank {error.error_index} exited with code {error.exit_code} "
                f"(signal {error.signal_name or 'none'}); all other ranks were stopped",
                rank=error.error_index, partial=_partials(Path(out_dir))) from None
        except KeyboardInterrupt:
            _let_ranks_stop(context.processes)
            raise RunInterrupted("interrupted (Ctrl-C); all ranks were stopped",
                                 cause="interrupted", partial=_partials(Path(out_dir))) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            for process in context.processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
            rendezvous.close()
        missing = [r for r in range(world_size) if not (Path(out_dir) / f"rank{r}.pkl").exists()]
        if missing:  # e.g. the ranks took a Ctrl-C the launcher did not see
            raise RunInterrupted(f"ranks {missing} stopped without a result",
                                 cause="interrupted", partial=_partials(Path(out_dir)))
        results = []
        for rank in range(world_size):
            with open(Path(out_dir) / f"rank{rank}.pkl", "rb") as handle:
                results.append(pickle.load(handle))
        return results


def _let_ranks_stop(processes: list[mp.Process], grace_s: float = 5.0) -> None:
    """After a Ctrl-C, give the ranks a moment to record what they did (they got the SIGINT
    too from a terminal; otherwise send it), then the caller's ``finally`` stops the rest."""
    for process in processes:
        if process.is_alive() and process.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))


def _root_cause(out_dir: Path, first: int, first_trace: str) -> tuple[int, str, str]:
    """``(rank, one-line cause, traceback)`` of a failed run.

    The rank torch reports first may only have lost its peer (a closed connection) while
    another rank holds the real cause; ranks fail within moments of each other, so wait a
    little for their reports and prefer a bad input or a diverging loss over a lost peer.
    """
    time.sleep(0.3)
    reports = {}
    for path in out_dir.glob(_ERROR_FILE.format("*")):
        try:
            reports[_file_rank(path)] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    chosen = next((r for r in sorted(reports) if reports[r]["user_error"]),
                  first if first in reports else None)
    if chosen is None:
        lines = first_trace.splitlines()
        return first, lines[-1] if lines else "unknown error", first_trace
    report = reports[chosen]
    message = " ".join(report["message"].split()) if report["message"] else report["type"]
    if not report["user_error"] and report["message"]:  # not a bad input: say what broke
        message = f"{report['type']}: {message}"
    return chosen, message, report["trace"]


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
