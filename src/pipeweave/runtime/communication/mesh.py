"""Pipeline messages on a ``pp x dp x tp`` mesh: one lane per tensor-parallel index.

The schedule names pipeline ranks (``pp x dp``); with ``tp`` processes per rank, process
``rank * tp + index`` runs pipeline rank ``rank`` at tensor-parallel index ``index``
(:mod:`..execution.tensor_parallel`). :class:`MeshTransport` turns the ranks a program names
into the processes of the same index: activations and gradients at stage boundaries are whole
on every tensor-parallel process, so each sends and receives its own copy (``tp`` lanes of the
same bytes; sending once and broadcasting inside the receiving stage would save bandwidth but
add a collective on the critical path, docs/sharding.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

from torch import Tensor

from ...ir import Action, Schedule
from .transport import DistTransport, Waiting

__all__ = ["MeshTransport", "process_of", "lane_groups", "pipeline_results"]

T = TypeVar("T")


def process_of(rank: int, index: int, tp: int) -> int:
    """The process that runs pipeline rank ``rank`` at tensor-parallel index ``index``."""
    return rank * tp + index


def lane_groups(groups: Sequence[Sequence[int]], tp: int) -> list[list[int]]:
    """Every group of pipeline ranks as process groups, one per tensor-parallel index (in
    one order every process agrees on, for ``DistTransport.make_groups``)."""
    return [[process_of(r, index, tp) for r in group] for group in groups for index in range(tp)]


def pipeline_results(results: Sequence[T], tp: int) -> list[T]:
    """One result per pipeline rank from every process's (in process order): index 0's, as
    the ``tp`` processes of a rank report the same losses and whole parameters."""
    return list(results[::tp])


class MeshTransport:
    """A :class:`DistTransport` of one process, addressed by pipeline ranks."""

    def __init__(self, inner: DistTransport, *, rank: int, index: int, tp: int) -> None:
        self.inner = inner
        self.rank = rank
        """The pipeline rank this process runs."""
        self.index = index
        self.tp = tp

    def _process(self, rank: int) -> int:
        return process_of(rank, self.index, self.tp)

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    @property
    def rendezvous(self) -> bool:
        return self.inner.rendezvous

    def track_deliveries(self, schedule: Schedule) -> None:
        self.inner.track_deliveries(schedule, rank=self.rank)

    def send(self, message: Action, tensor: Tensor, dst: int) -> None:
        self.inner.send(message, tensor, self._process(dst))

    def recv(self, message: Action, src: int) -> Waiting:
        return self.inner.recv(message, self._process(src))

    def prefetch(self, message: Action, src: int) -> None:
        self.inner.prefetch(message, self._process(src))

    def all_reduce(self, key: Hashable, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        return self.inner.all_reduce(key, flat, [self._process(r) for r in ranks])

    def group(self, ranks: Sequence[int]) -> object:
        return self.inner.group([self._process(r) for r in ranks])

    def finish(self) -> None:
        self.inner.finish()
