"""The cores one pytest-xdist worker is pinned to when the suite runs on a many-core machine.

The suite is sized for this project's 2-core machine: a multi-rank test gives each rank
``cores // ranks`` intra-op threads (``pipeweave.host.threads_per_rank``, which reads the
process's affinity mask). Under pytest-xdist on a 16-core host every worker would see all 16
cores, and 14 workers each starting ranks with 8 threads oversubscribe the host many times
over (``scripts/gpu_check.sh suite`` reached 29 % in 530 s that way on 2026-11-27). With
``PIPEWEAVE_TEST_CORES=k`` set, worker ``gwN`` is pinned to its own ``k`` cores, so each
worker and the ranks it starts see a ``k``-core machine, as the tests expect.
"""

from __future__ import annotations

import os

__all__ = ["worker_cores", "pin_this_worker"]


def worker_cores(worker: str, per_worker: int, allowed: list[int]) -> set[int]:
    """Cores for xdist worker ``worker`` (``gw0``, ``gw1``, …): the ``per_worker`` cores of
    its own slot in ``allowed`` (sorted), wrapping round when workers outnumber slots."""
    if not worker.startswith("gw") or not worker[2:].isdigit():
        raise ValueError(f"xdist worker id {worker!r} is not gwN; "
                         "unset PIPEWEAVE_TEST_CORES outside pytest-xdist")
    if per_worker < 1:
        raise ValueError(f"PIPEWEAVE_TEST_CORES={per_worker}: give a positive number of cores")
    ordered = sorted(allowed)
    if per_worker > len(ordered):
        return set(ordered)
    slots = len(ordered) // per_worker
    start = (int(worker[2:]) % slots) * per_worker
    return set(ordered[start:start + per_worker])


def pin_this_worker() -> None:
    """Pin this process as ``PIPEWEAVE_TEST_CORES`` and ``PYTEST_XDIST_WORKER`` say; a no-op
    when either is unset or the platform has no affinity masks."""
    per_worker = os.environ.get("PIPEWEAVE_TEST_CORES")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not per_worker or not worker or not hasattr(os, "sched_setaffinity"):
        return
    cores = worker_cores(worker, int(per_worker), list(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, cores)
