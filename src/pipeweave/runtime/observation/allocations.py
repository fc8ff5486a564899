"""Peak bytes of the tensors one rank allocates, measured at the allocator (``Job.track_allocations``).

What ``planner/memory.py`` predicts is tensor memory: parameters, gradients, optimizer state,
weight copies, activations, buffers. The run's ``peak_memory_bytes`` on a CPU is the process's
peak RSS, which also holds the interpreter, torch's libraries, the profiler's own data and
allocator slack (hundreds of MB beside a small model's few MB) and never goes down, so it
cannot check that prediction. This tracker measures the tensor part itself:

* **CPU**: torch's CPU allocator reports every allocation and free to the profiler when it
  records memory (``torch.profiler.profile(profile_memory=True)``); the tracker starts before
  the rank builds its model and replays the reported sizes in time order, so its peak is the
  most tensor bytes alive at once from the model's construction to the end of the run
  (transient tensors inside a forward or backward included). Tensors that existed before the
  start (none of the rank's model) are not seen.
* **CUDA**: ``torch.cuda.max_memory_allocated`` over the same span, less what was allocated
  at the start.

The profiler slows a run down and keeps every event in memory: use it for short measuring
runs (``benchmarks/memory_model.py``), not for training.
"""

from __future__ import annotations

from types import TracebackType

import torch

from ...profiler.measure import allocated_peak, memory_profiler

__all__ = ["AllocationTracker"]


class AllocationTracker:
    """Context manager measuring :attr:`peak` bytes of live tensors (module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._profiler: torch.profiler.profile | None = None
        self._base = 0

    def __enter__(self) -> "AllocationTracker":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._profiler = memory_profiler()
            self._profiler.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(0, torch.cuda.max_memory_allocated(self.device) - self._base)
            return
        assert self._profiler is not None
        self._profiler.__exit__(kind, error, trace)
        if kind is None:
            self.peak = allocated_peak(self._profiler)
