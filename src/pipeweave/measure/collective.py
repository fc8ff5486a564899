"""Time the runtime's all-reduce between two local processes at several sizes, and fit its
effective bandwidth (``RuntimeCosts.allreduce_bandwidth``, :mod:`pipeweave.profiler.runtime_costs`).

The runtime sums a replicated stage's gradients by concatenating them into one flat tensor,
all-gathering every replica's copy over gloo and adding the copies
(``runtime/communication/transport.py``); this times exactly those steps, on two
``forkserver`` processes with one intra-op thread each (as two training ranks on this
machine), the median of ``repeats`` after a barrier at each size (what a run pays, not the
best case a ping-pong's minimum gives), and fits ``time = latency + bytes / bandwidth`` with
:func:`pipeweave.profiler.link.fit_link`. Measured 2026-11-27 on this 2-core machine (load
about 2): 0.39 ms at 1 KiB, 4.5 ms at 1 MiB, 74 ms at 16 MiB, some 0.25 GB/s, against the
3.6 GB/s the link's ping-pong fits: the ring formula at the link under-counts it tenfold.
The latency fitted here is only the call's own; what a real run adds (the replicas reaching
the all-reduce at different times, waking up) is fitted from a run of a data-parallel plan
(:mod:`pipeweave.measure.calibration_runs`).
"""

from __future__ import annotations

import datetime
import os
import pickle
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from ..profiler.link import fit_link, run_pair
from ..profiler.profile import LinkProfile

__all__ = ["ALLREDUCE_SIZES", "measure_allreduce"]

ALLREDUCE_SIZES = (1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23)
"""Gradient bytes timed (4 KiB .. 8 MiB)."""


def measure_allreduce(*, sizes: Sequence[int] = ALLREDUCE_SIZES, repeats: int = 8,
                      timeout_s: float = 120.0) -> LinkProfile:
    """The runtime's all-reduce timed between two local processes and fitted (module
    docstring): ``LinkProfile(bandwidth, latency)`` of ``time = latency + bytes /
    bandwidth``."""
    if repeats < 1 or len(set(sizes)) < 2:
        raise ValueError(f"timing the all-reduce needs repeats >= 1 and two or more sizes, "
                         f"got repeats={repeats}, sizes={list(sizes)}")
    samples = run_pair(_rank, (list(sizes), repeats, timeout_s), name="allreduce",
                       what="timing the all-reduce", timeout_s=timeout_s)
    return fit_link(samples)


def _once(parts: list[torch.Tensor]) -> float:
    """Seconds of one all-reduce of ``parts`` as the runtime does it (module docstring)."""
    started = time.perf_counter()
    flat = torch.cat([p.reshape(-1) for p in parts])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    work = dist.all_gather(gathered, flat, async_op=True)
    assert work is not None
    work.wait()
    total = gathered[0].clone()
    for part in gathered[1:]:
        total += part
    offset = 0
    for p in parts:
        total.narrow(0, offset, p.numel()).view_as(p).clone()
        offset += p.numel()
    return time.perf_counter() - started


def _rank(index: int, init_method: str, sizes: list[int], repeats: int, timeout_s: float,
          out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=index, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        samples = []
        for size in sizes:
            count = max(4, size // 4)
            parts = list(torch.ones(count).chunk(4))  # a stage's parameters: a few tensors
            times = []
            for run in range(repeats + 1):  # the first of each size warms up
                dist.barrier()
                seconds = _once(parts)
                if run:
                    times.append(seconds)
            samples.append((float(count * 4), statistics.median(times)))
        if index == 0:
            path = Path(out_dir) / "allreduce.pkl"
            with open(path.with_suffix(".tmp"), "wb") as handle:
                pickle.dump(samples, handle)
            os.replace(path.with_suffix(".tmp"), path)
    finally:
        dist.destroy_process_group()
