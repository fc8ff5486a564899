"""How fast APC's codec runs: float32 bytes per second through encode and decode.

APC (WPipe's automatic precision compression, ``pipeweave/apc.py``) sends a float32
activation or gradient as float16: the sender scales it by a power of two and converts it
(checking for overflow and underflow), the receiver converts back and rescales. Halving the
bytes on the wire is a gain only where the link is slower than that work; the planners price
it from this rate (``Profile.apc_bytes_per_second``). The runtime's own ``encode``/``decode``
are timed, on the device the model is profiled on, on a tensor the size of the model's largest
block output (what crosses a stage boundary): warm-up runs, then the median of ``repeats``.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["measure_apc_rate"]

MIN_ELEMENTS = 4096
"""A message smaller than this is timed at this size (a rate from a few bytes is noise)."""


def measure_apc_rate(nbytes: float, *, device: str = "cpu", warmup: int = 2,
                     repeats: int = 5) -> float:
    """Float32 bytes per second through one encode and one decode of ``nbytes``."""
    from ..apc import decode, encode

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    target = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    elements = max(MIN_ELEMENTS, int(nbytes) // 4)
    tensor = torch.randn(elements, generator=generator).to(target)
    cuda = target.type == "cuda"
    times = []
    for run in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize(target)
        started = time.perf_counter()
        decode(encode(tensor), torch.float32)
        if cuda:
            torch.cuda.synchronize(target)
        if run >= warmup:
            times.append(time.perf_counter() - started)
    return 4.0 * elements / max(statistics.median(times), 1e-9)
