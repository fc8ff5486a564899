"""MicrobatchSource: cuts a stream of batches into the micro-batches the schedule names.

Micro-batch ``j`` of pipeline ``p`` belongs to iteration ``k = j // M`` and is row block
``j % M`` of batch number ``k * N + p`` of the stream (N parallel pipelines take consecutive
batches). A Slicer half (piece 1/2) is the first/second half of those rows.

Every rank that needs data (the first stage for inputs, the last for targets) reads the same
deterministic stream, so no data travels between ranks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from ...ir import Action

__all__ = ["MicrobatchSource", "data_window"]

Batch = tuple[Tensor, Tensor]


def data_window(program: Sequence[Action], *, microbatches: int, pipelines: int = 1) -> int:
    """How many batches a rank running ``program`` must keep at once: at every action, from
    the oldest batch an action still to come names to the newest one named so far.

    Every action with a micro-batch counts (a conservative superset of those reading data:
    a recomputed or predicted forward reads its inputs again at its backward), so 1F1B keeps
    one or two batches, not a fixed window (16 batches of images on a GPU are hundreds of MB).
    """
    batches = [(a.microbatch // microbatches) * pipelines + a.pipeline
               for a in program if a.microbatch is not None]
    window, newest = 1, -1
    oldest_ahead = list(batches)
    for i in range(len(batches) - 2, -1, -1):
        oldest_ahead[i] = min(batches[i], oldest_ahead[i + 1])
    for i, batch in enumerate(batches):
        newest = max(newest, batch)
        window = max(window, newest - oldest_ahead[i] + 1)
    return window


def _to(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``; to a GPU through pinned memory without waiting (a copy from
    pageable memory makes the host wait until the GPU reaches it: once per batch, the GPU
    then idles while the host queues the next kernels)."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class MicrobatchSource:
    """Lazily draws batches from ``stream`` and serves micro-batch row slices of them."""

    def __init__(self, stream: Iterable[Batch], *, microbatches: int, pipelines: int = 1,
                 device: torch.device | None = None, window: int = 16,
                 first_batch: int = 0) -> None:
        # ``first_batch``: the stream's first batch is batch number ``first_batch`` (a resumed
        # run's stream starts where the checkpoint left off).
        self._iterator: Iterator[Batch] = iter(stream)
        self.microbatches = microbatches
        self.pipelines = pipelines
        self.device = device
        self.window = window
        self._cache: OrderedDict[int, Batch] = OrderedDict()
        self._drawn = first_batch
        self.batch_rows: int | None = None

    def _batch(self, index: int) -> Batch:
        if index in self._cache:
            return self._cache[index]
        if index < self._drawn:
            raise RuntimeError(
                f"batch {index} was already dropped from the window of {self.window} batches; "
                f"the schedule keeps more iterations in flight than the window allows"
            )
        while self._drawn <= index:
            try:
                inputs, targets = next(self._iterator)
            except StopIteration:
                raise ValueError(
                    f"the data ran out after {self._drawn} batches; the run needs batch {index}. "
                    f"Give more data or fewer --steps"
                ) from None
            self._check(inputs, targets)
            if self.device is not None:
                inputs, targets = _to(inputs, self.device), _to(targets, self.device)
            self._cache[self._drawn] = (inputs, targets)
            self._drawn += 1
            while len(self._cache) > self.window:
                self._cache.popitem(last=False)
        return self._cache[index]

    def _check(self, inputs: Tensor, targets: Tensor) -> None:
        rows = inputs.shape[0]
        if targets.shape[0] != rows:
            raise ValueError(f"a batch has {rows} input rows but {targets.shape[0]} target rows")
        if self.batch_rows is None:
            if rows % self.microbatches:
                raise ValueError(
                    f"batch size {rows} is not divisible by microbatches={self.microbatches}; "
                    f"use a batch size that is a multiple of {self.microbatches}"
                )
            self.batch_rows = rows
        elif rows != self.batch_rows:
            raise ValueError(f"batch sizes must be constant: got {rows} after {self.batch_rows}")

    def _rows(self, microbatch: int, piece: int, pipeline: int, which: int) -> Tensor:
        iteration, index = divmod(microbatch, self.microbatches)
        tensor = self._batch(iteration * self.pipelines + pipeline)[which]
        size = tensor.shape[0] // self.microbatches
        rows = tensor.narrow(0, index * size, size)
        if piece == 0:
            return rows
        if size < 2:
            raise ValueError(
                f"micro-batch of {size} row cannot be split in halves (Slicer); use a batch size "
                f"of at least 2 x microbatches"
            )
        return torch.tensor_split(rows, 2)[piece - 1]

    def inputs(self, microbatch: int, piece: int = 0, pipeline: int = 0) -> Tensor:
        return self._rows(microbatch, piece, pipeline, 0)

    def targets(self, microbatch: int, piece: int = 0, pipeline: int = 0) -> Tensor:
        return self._rows(microbatch, piece, pipeline, 1)
