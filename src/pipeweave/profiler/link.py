"""Measure the point-to-point link between two local ranks: bandwidth and latency.

Two processes (``forkserver``, as :mod:`pipeweave.runtime.launch.processes` starts ranks) join a gloo
process group over loopback (or NCCL between two GPUs). For each message size rank 0 sends a
tensor and rank 1 sends it back (ping-pong); half the fastest round trip is the one-way time
(the minimum filters out scheduling noise on a busy machine, as latency benchmarks do), and a
least-squares line through ``(bytes, time)``, weighted for relative error so that the small
messages fix the latency, gives the link model the planner uses::

    time(bytes) = latency + bytes / bandwidth
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..devices import place
from ..host import FORKSERVER_PRELOAD, free_port
from .profile import LinkProfile

__all__ = ["measure_link", "fit_link", "run_pair", "DEFAULT_SIZES"]

DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
"""Message sizes in bytes (1 KiB .. 16 MiB)."""


def fit_link(samples: Sequence[tuple[float, float]]) -> LinkProfile:
    """Least-squares ``time = latency + bytes / bandwidth`` through ``(bytes, seconds)`` samples,
    each weighted by ``1 / time**2``: the line's relative error is what is minimised, so the
    small messages (where the latency is the whole time) count as much as the large ones
    (where a plain fit puts all its weight and leaves a latency of noise, often below 0)."""
    if len(samples) < 2 or len({b for b, _ in samples}) < 2:
        raise ValueError("fitting a link needs samples at two or more message sizes")
    xs, ys = [float(b) for b, _ in samples], [float(t) for _, t in samples]
    if min(ys) <= 0:
        raise ValueError(f"link timings must be > 0 seconds, got {samples}")
    weights = [1.0 / (y * y) for y in ys]
    total = sum(weights)
    mx = sum(w * x for w, x in zip(weights, xs)) / total
    my = sum(w * y for w, y in zip(weights, ys)) / total
    spread = sum(w * (x - mx) ** 2 for w, x in zip(weights, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(weights, xs, ys)) / spread
    if slope <= 0:
        raise ValueError(f"link timings do not grow with message size ({samples}); measure again "
                         "with larger messages")
    return LinkProfile(bandwidth=1.0 / slope, latency=max(0.0, my - slope * mx))


def measure_link(*, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10, device: str = "cpu",
                 timeout_s: float = 60.0) -> LinkProfile:
    """Ping-pong between two local processes and fit the link (module docstring)."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        raise ValueError("measuring a GPU link needs two visible GPUs; use --device cpu or skip "
                         "the link measurement")
    samples = run_pair(_rank, (list(sizes), repeats, device, timeout_s), name="link",
                       what="link measurement", timeout_s=timeout_s)
    return fit_link(samples)


def run_pair(rank: Callable[..., None], args: tuple[Any, ...], *, name: str, what: str,
             timeout_s: float) -> Any:
    """Run ``rank(index, init_method, *args, out_dir)`` in two local processes (the fork
    server, torch preloaded) and return what rank 0 pickled to ``out_dir/<name>.pkl``; past
    ``timeout_s`` both are stopped and ``what`` named in the error."""
    mp.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix=f"pipeweave-{name}-") as out_dir:
        context = mp.start_processes(rank, args=(init_method, *args, out_dir), nprocs=2,
                                     join=False, start_method="forkserver")
        started = time.monotonic()
        try:
            while not context.join(timeout=0.5):
                if time.monotonic() - started > timeout_s:
                    raise RuntimeError(f"{what} exceeded {timeout_s:.0f} s; stopped it")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                process.join(timeout=10)
        with open(Path(out_dir) / f"{name}.pkl", "rb") as handle:
            return pickle.load(handle)


def _rank(index: int, init_method: str, sizes: list[int], repeats: int, device: str,
          timeout_s: float, out_dir: str) -> None:
    torch.set_num_threads(1)
    placement = place(device, local_rank=index, local_ranks=2)  # as a training rank's
    target = placement.device
    if device == "cuda":
        torch.cuda.set_device(target)
    dist.init_process_group(placement.backend, init_method=init_method, rank=index, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            **placement.group_options())
    try:
        samples = []
        for size in sizes:
            buffer = torch.zeros(max(1, size // 4), dtype=torch.float32, device=target)
            times = []
            for run in range(repeats + 1):  # the first exchange of each size warms up
                dist.barrier(**placement.barrier_options())
                started = time.perf_counter()
                if index == 0:
                    dist.send(buffer, dst=1)
                    dist.recv(buffer, src=1)
                else:
                    dist.recv(buffer, src=0)
                    dist.send(buffer, dst=0)
                if device == "cuda":
                    torch.cuda.synchronize()
                if run:
                    times.append((time.perf_counter() - started) / 2)
            samples.append((float(buffer.numel() * 4), min(times)))
        if index == 0:
            path = Path(out_dir) / "link.pkl"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as handle:
                pickle.dump(samples, handle)
            os.replace(tmp, path)
    finally:
        dist.destroy_process_group()
