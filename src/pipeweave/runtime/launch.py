"""Launchers: pipeweave's own local spawner, and running under torchrun.

The local spawner starts one process per rank (``forkserver`` method), points them at a
free loopback port, and watches them: when one rank fails, the others are terminated at once
and :class:`RunFailed` carries the failing rank's traceback; nothing is left running. Results
come back through files in a private temporary folder (one pickle per rank, written
atomically by the rank and read once by the launcher that created the folder).
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from .checkpoint import check_checkpointable, check_resume
from .distributed import run_rank
from .faults import exit_with_launcher
from .job import Job
from .online_advance import check_advance
from .worker import RankResult, make_schedule, preflight

__all__ = ["launch_local", "run_under_torchrun", "RunFailed", "free_port", "under_torchrun"]


class RunFailed(RuntimeError):
    """A rank failed; the message names it and includes its error."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawned_rank(index: int, job: Job, world_size: int, init_method: str, out_dir: str,
                  launcher_pid: int) -> None:
    exit_with_launcher(launcher_pid)  # the launcher killed (even by SIGKILL): leave nothing behind
    (result,) = run_rank(job, rank=index, world_size=world_size, local_rank=index,
                         local_world_size=world_size, init_method=init_method)
    path = Path(out_dir) / f"rank{index}.pkl"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(result, handle)
    os.replace(tmp, path)


def launch_local(job: Job, *, deadline_s: float | None = None) -> list[RankResult]:
    """Run ``job`` on ``plan.world_size`` local processes; one result per rank.

    Raises :class:`RunFailed` if any rank fails (the others are terminated), or if the whole
    run exceeds ``deadline_s`` seconds.
    """
    schedule = make_schedule(job.plan, job.steps)
    world_size = schedule.num_ranks
    inputs, _ = next(iter(job.data()))
    spec = job.model()
    preflight(spec, job.plan, inputs)
    check_advance(job, spec)
    check_checkpointable(job, schedule)
    check_resume(job, spec)  # a bad checkpoint is reported before any rank starts
    # forkserver: the server imports torch once (no kernels run there, so no thread pools
    # exist to break by forking); each launch then forks ranks in milliseconds instead of
    # re-importing torch in every fresh interpreter as ``spawn`` does.
    mp.set_forkserver_preload(["torch", "pipeweave.runtime.distributed"])
    init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="pipeweave-") as out_dir:
        context = mp.start_processes(
            _spawned_rank, args=(job, world_size, init_method, out_dir, os.getpid()),
            nprocs=world_size,
            join=False, start_method="forkserver",
        )
        started = time.monotonic()
        try:
            while not context.join(timeout=0.5):
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    raise RunFailed(f"run exceeded its deadline of {deadline_s:.0f} s; stopped all ranks")
        except mp.ProcessRaisedException as error:
            trace = str(error).strip()
            headline = trace.splitlines()[-1] if trace else "unknown error"
            raise RunFailed(f"rank {error.error_index} failed: {headline}\n"
                            f"all other ranks were stopped; the failing rank's traceback:\n{trace}") from None
        except mp.ProcessExitedException as error:
            raise RunFailed(
                f"rank {error.error_index} exited with code {error.exit_code} "
                f"(signal {error.signal_name or 'none'}); all other ranks were stopped"
            ) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            for process in context.processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
        results = []
        for rank in range(world_size):
            with open(Path(out_dir) / f"rank{rank}.pkl", "rb") as handle:
                results.append(pickle.load(handle))
        return results


def under_torchrun() -> bool:
    """True when the usual torchrun environment variables are present."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_under_torchrun(job: Job) -> list[RankResult]:
    """Run this process's rank as torchrun set it up; rank 0 gets every rank's result."""
    return run_rank(
        job, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        gather=True, store=restart_safe_store(job.timeout_s),
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
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           int(os.environ["WORLD_SIZE"]), False,
                           timeout=datetime.timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"pipeweave/attempt-{attempt}/", client)
