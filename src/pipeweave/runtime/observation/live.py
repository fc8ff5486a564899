"""The tensors a process still reaches, counted: the check that a long run stays flat.

A leak in a training loop shows as tensors that outlive their step. :func:`live_tensors`
collects garbage and counts every tensor Python can reach and the bytes of their distinct
storages (meta tensors hold none). Taken at the same phase of two iterations of a steady
pipeline, the two must be equal; ``tests/runtime/test_flat_memory.py`` and
``benchmarks/soak.py`` compare them. It walks every object the collector tracks: for
measuring runs, not for every step of training.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["LiveTensors", "live_tensors", "live_tensors_between"]


@dataclass(frozen=True)
class LiveTensors:
    """How many tensors are alive and the bytes of their distinct storages."""

    tensors: int
    storage_bytes: int


def live_tensors() -> LiveTensors:
    """Count the live tensors now (after a full garbage collection)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on a deprecated torch alias object warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    storages: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return LiveTensors(len(tensors), sum(storages.values()))


def live_tensors_between(run: Callable[[int], object], *, first: int, second: int,
                         total: int) -> tuple[LiveTensors, LiveTensors]:
    """Live tensors after step ``first`` and after step ``second`` of ``run(total)``.

    ``run(n)`` trains ``n`` steps in this process. A first ``run(1)`` counts the optimizer
    steps one training step takes (one per stage, or per micro-batch for PipeDream); the
    counts are then taken in torch's global optimizer post-step hook, at the same phase of
    both steps. Leave a few steps after ``second``: an asynchronous schedule drains its
    pipeline in its last steps, which then hold less than the steady state.
    """
    if not 0 < first < second <= total:
        raise ValueError(f"need 0 < first < second <= total, got {first}, {second}, {total}")
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    with _after_every_optimizer_step(count):
        run(1)
    per_step, calls = calls, 0
    if per_step == 0:
        raise ValueError("run(1) took no optimizer step")
    at = {first * per_step: 0, second * per_step: 1}
    seen: list[LiveTensors | None] = [None, None]

    def watch(*_: object) -> None:
        nonlocal calls
        calls += 1
        if calls in at:
            seen[at[calls]] = live_tensors()

    with _after_every_optimizer_step(watch):
        run(total)
    early, late = seen
    if early is None or late is None or calls != total * per_step:
        raise ValueError(f"run({total}) took {calls} optimizer steps, not {total} x {per_step} "
                         f"as run(1) did: the steps are not alike")
    return early, late


@contextmanager
def _after_every_optimizer_step(hook: Callable[..., None]) -> Iterator[None]:
    handle = register_optimizer_step_post_hook(hook)
    try:
        yield
    finally:
        handle.remove()
