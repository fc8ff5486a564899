"""Layout: which ranks host which (virtual) stage, and how micro-batches are routed.

One mechanism covers every placement the papers use:

* a straight pipeline: stage ``s`` on rank ``s``;
* chunks / virtual stages (interleaved 1F1B, WPipe's two groups): stage ``s`` on rank ``s % P``;
* a V (zero-bubble V-shape schedules): ``2P`` stages, rank ``r`` holding stages ``r`` and
  ``2P - 1 - r``, so the model goes down the ranks and comes back up and the last stage (the
  loss) sits on rank 0 beside the first;
* replicated stages (PipeDream's 1F1B-RR): stage ``s`` on several ranks, micro-batch ``j``
  routed round-robin to replica ``j % r_s`` for forward *and* backward;
* data-parallel width ``w`` (WPipe's depth x width, plain DP of a pipeline): every stage
  replicated ``w`` times, so micro-batch ``j`` runs end to end on pipeline copy ``j % w``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """Ranks of every stage; ``stage_ranks[s]`` lists the replicas of stage ``s`` in routing order."""

    stage_ranks: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.stage_ranks:
            raise ValueError("a layout needs at least one stage")
        for stage, ranks in enumerate(self.stage_ranks):
            if not ranks:
                raise ValueError(f"stage {stage} has no rank; give it at least one")
            if len(set(ranks)) != len(ranks) or min(ranks) < 0:
                raise ValueError(f"stage {stage} has invalid ranks {ranks}: use distinct ranks >= 0")
        used = {r for ranks in self.stage_ranks for r in ranks}
        if used != set(range(len(used))):
            raise ValueError(f"ranks must be numbered 0..R-1 without gaps, got {sorted(used)}")

    # -- constructors -------------------------------------------------------------
    @classmethod
    def straight(cls, ranks: int) -> "Layout":
        """Stage ``s`` on rank ``s``."""
        _check_positive("ranks", ranks)
        return cls(tuple((r,) for r in range(ranks)))

    @classmethod
    def chunked(cls, ranks: int, chunks: int) -> "Layout":
        """``ranks * chunks`` stages, stage ``s`` on rank ``s % ranks`` (interleaved, WPipe)."""
        _check_positive("ranks", ranks)
        _check_positive("chunks", chunks)
        return cls(tuple((s % ranks,) for s in range(ranks * chunks)))

    @classmethod
    def v_shape(cls, ranks: int, width: int = 1) -> "Layout":
        """``2 * ranks`` stages in a V: rank ``r`` holds stages ``r`` and ``2*ranks - 1 - r``.

        The forward goes down the ranks (stages ``0 .. ranks-1``) and back up (stages
        ``ranks .. 2*ranks-1``): both stages at the bottom of the V sit on rank ``ranks - 1``,
        so that boundary needs no message, and the last stage is on rank 0. ``width`` copies
        as in :meth:`data_parallel`. Example, ``ranks=3``: stages 0..5 on ranks 0 1 2 2 1 0.
        """
        _check_positive("ranks", ranks)
        base = cls(tuple((min(s, 2 * ranks - 1 - s),) for s in range(2 * ranks)))
        return base._copies(ranks, width)

    @classmethod
    def replicated(cls, replicas: Sequence[int]) -> "Layout":
        """Stage ``s`` on ``replicas[s]`` consecutive ranks (PipeDream's replicated stages)."""
        stages: list[tuple[int, ...]] = []
        next_rank = 0
        for stage, count in enumerate(replicas):
            if count < 1:
                raise ValueError(f"stage {stage} has {count} replicas; each stage needs >= 1")
            stages.append(tuple(range(next_rank, next_rank + count)))
            next_rank += count
        return cls(tuple(stages))

    @classmethod
    def data_parallel(cls, depth: int, width: int, chunks: int = 1) -> "Layout":
        """``width`` copies of a ``depth``-rank pipeline; copy ``k`` uses ranks ``k*depth ..``."""
        _check_positive("depth", depth)
        return cls.chunked(depth, chunks)._copies(depth, width)

    def _copies(self, depth: int, width: int) -> "Layout":
        """``width`` copies of this one-copy layout on ``depth`` ranks; copy ``k`` uses ranks
        ``k*depth ..`` (micro-batch ``j`` runs on copy ``j % width``)."""
        _check_positive("width", width)
        return Layout(tuple(tuple(k * depth + ranks[0] for k in range(width))
                            for ranks in self.stage_ranks))

    # -- queries --------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @cached_property
    def num_ranks(self) -> int:
        return 1 + max(r for ranks in self.stage_ranks for r in ranks)

    def replicas(self, stage: int) -> int:
        return len(self.stage_ranks[stage])

    def rank_of(self, stage: int, microbatch: int) -> int:
        """The rank that runs ``stage`` for ``microbatch`` (round-robin over replicas)."""
        ranks = self.stage_ranks[stage]
        return ranks[microbatch % len(ranks)]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages (chunks) hosted by ``rank``, in stage order."""
        by_rank = self._stages_by_rank
        return by_rank[rank] if 0 <= rank < len(by_rank) else ()

    @cached_property
    def _stages_by_rank(self) -> tuple[tuple[int, ...], ...]:
        """:meth:`stages_of` of every rank, in one pass (asked for every rank of 1,024-rank
        layouts, rank by rank, by the memory model and the search's floors)."""
        by_rank: list[list[int]] = [[] for _ in range(self.num_ranks)]
        for stage, ranks in enumerate(self.stage_ranks):
            for rank in ranks:
                by_rank[rank].append(stage)
        return tuple(map(tuple, by_rank))

    def to_json(self) -> list[list[int]]:
        return [list(ranks) for ranks in self.stage_ranks]

    @classmethod
    def from_json(cls, data: Sequence[Sequence[int]]) -> "Layout":
        return cls(tuple(tuple(int(r) for r in ranks) for ranks in data))


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
