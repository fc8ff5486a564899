"""Facts about the machine this process runs on, without torch: cores, the intra-op threads
one of several local ranks gets, a free loopback port. The profiler, the planner's command
line and the runtime all ask these questions; none of them needs torch to answer."""

from __future__ import annotations

import os
import socket

__all__ = ["machine_cores", "threads_per_rank", "free_port", "FORKSERVER_PRELOAD"]

FORKSERVER_PRELOAD = ("torch", "torch._dynamo")
"""What a ``forkserver`` that starts local ranks imports once, so that every process it forks
has it: torch, and torch._dynamo, which the first optimizer a process builds imports
(torch.optim's ``_disable_dynamo``): seconds of CPU that every rank would pay again. The
first user in a process starts the server, so every user preloads at least this."""


def machine_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(local_world_size: int) -> int:
    """Intra-op threads so that the ranks on one machine don't oversubscribe its cores."""
    return max(1, machine_cores() // max(1, local_world_size))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
