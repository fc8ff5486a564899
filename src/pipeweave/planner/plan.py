"""Plan: a plain, JSON-serialisable description of how a model is pipelined.

A plan says which contiguous block range each stage holds, how stages map onto ranks (chunks
per rank, replicas per stage, data-parallel width, parallel pipelines), the micro-batch count,
the schedule and its options, the weight semantics and recomputation per stage. It is what
planners write and what ``pipeweave train --plan FILE`` reads.

Example (``gpt-tiny`` has 10 blocks; two ranks, 1F1B, 4 micro-batches)::

    {"num_blocks": 10, "stages": [[0, 5], [5, 10]], "schedule": "1f1b", "microbatches": 4}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..ir import Layout
from ..schedules import Shape, get_info
from .partition import uniform_partition
from .semantics_options import Semantics, check_semantics
from .sharding import check_shard
from .tensor_parallel import check_tp

__all__ = ["Plan"]


@dataclass(frozen=True)
class Plan:
    """How a model of ``num_blocks`` blocks is split and scheduled.

    Attributes:
        num_blocks: blocks in the model; the stages must cover ``0 .. num_blocks-1`` exactly.
        stages: ``[start, end)`` block range of every (virtual) stage, in pipeline order.
            With ``chunks = v`` there are ``depth * v`` entries; stage ``s`` lives on rank
            ``s % depth`` of each pipeline copy.
        schedule: registered schedule name (see ``pipeweave schedules``).
        microbatches: M, micro-batches per iteration; the batch size must be divisible by it.
        chunks: model chunks per rank (interleaved 1F1B, WPipe).
        replicas: per-stage replica counts (PipeDream 1F1B-RR); ``None`` = one each.
        width: data-parallel copies of the whole pipeline (gradients all-reduced per stage).
        pipelines: AvgPipe's parallel pipelines sharing the ranks.
        shard: how each stage is held over its ``width`` data-parallel ranks: ``none``
            (replicated, gradients all-reduced), ``full`` (FSDP2, ZeRO-3) or ``grad-op``
            (FSDP2 keeping parameters gathered from forward to backward, ZeRO-2); see
            :mod:`.sharding` and docs/sharding.md.
        tp: tensor-parallel processes per pipeline rank: each stage's layers split by heads
            and hidden units over ``tp`` processes (the mesh ``pp x dp x tp``; the schedule
            sees only ``pp x dp``); see :mod:`.tensor_parallel` and docs/sharding.md.
        recompute: per stage, whether to recompute activations in the backward instead of
            keeping them (empty = no recomputation anywhere).
        schedule_options: extra options for the schedule generator (e.g. ``{"advance": 2}``).
        semantics: weight-semantics options, a :class:`.Semantics` (e.g.
            ``Semantics(backward="graph")`` for PipeOptim); a plain mapping such as
            ``{"backward": "graph"}`` is accepted and converted. Each option given is checked
            against the schedule (:mod:`.semantics_options`).
    """

    num_blocks: int
    stages: tuple[tuple[int, int], ...]
    schedule: str = "1f1b"
    microbatches: int = 4
    chunks: int = 1
    replicas: tuple[int, ...] | None = None
    width: int = 1
    pipelines: int = 1
    shard: str = "none"
    tp: int = 1
    recompute: tuple[bool, ...] = ()
    schedule_options: Mapping[str, Any] = field(default_factory=dict)
    semantics: Semantics = field(default_factory=Semantics)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple((int(a), int(b)) for a, b in self.stages))
        if self.replicas is not None:
            object.__setattr__(self, "replicas", tuple(int(r) for r in self.replicas))
        object.__setattr__(self, "recompute", tuple(bool(r) for r in self.recompute))
        given: Any = self.semantics
        if not isinstance(given, Semantics):  # a plain mapping (JSON, dict literals)
            object.__setattr__(self, "semantics", Semantics.from_mapping(given))
        self._check_cover()
        check_semantics(self.schedule, self.semantics)
        check_shard(self.shard, schedule=self.schedule, width=self.width,
                    replicas=self.replicas, pipelines=self.pipelines)
        check_tp(self.tp, schedule=self.schedule, width=self.width, replicas=self.replicas,
                 pipelines=self.pipelines)
        for name in ("microbatches", "chunks", "width", "pipelines"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"plan {name} must be >= 1, got {getattr(self, name)}")
        if len(self.stages) % self.chunks:
            raise ValueError(
                f"plan has {len(self.stages)} stages, not a multiple of chunks={self.chunks}; "
                f"give depth x chunks stages"
            )
        if self.replicas is not None and len(self.replicas) != self.depth:
            raise ValueError(
                f"plan replicas {list(self.replicas)} needs one entry per stage ({self.depth})"
            )
        if self.recompute and len(self.recompute) != len(self.stages):
            raise ValueError(
                f"plan recompute has {len(self.recompute)} entries; give one per stage "
                f"({len(self.stages)}) or none"
            )

    def _check_cover(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not self.stages:
            raise ValueError("a plan needs at least one stage")
        expected_start = 0
        for index, (start, end) in enumerate(self.stages):
            if start != expected_start:
                problem = "overlaps the previous stage" if start < expected_start else "leaves a gap"
                raise ValueError(
                    f"stage {index} starts at block {start} but the previous stage ends at "
                    f"{expected_start}: it {problem}; stages must be contiguous [start, end) ranges "
                    f"covering blocks 0..{self.num_blocks - 1}"
                )
            if end <= start:
                raise ValueError(f"stage {index} range [{start}, {end}) is empty; give it >= 1 block")
            expected_start = end
        if expected_start != self.num_blocks:
            raise ValueError(
                f"stages end at block {expected_start} but the model has {self.num_blocks} blocks; "
                f"the last stage must end at {self.num_blocks}"
            )

    # -- derived shape --------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Ranks in one pipeline copy."""
        return len(self.stages) // self.chunks

    @property
    def world_size(self) -> int:
        """Pipeline ranks (``pp x dp``): the ranks the schedule has programs for."""
        if self.replicas is not None:
            return sum(self.replicas)
        return self.depth * self.width

    @property
    def processes(self) -> int:
        """Processes the run starts: ``tp`` per pipeline rank."""
        return self.world_size * self.tp

    def layout(self) -> Layout:
        """Which rank holds each stage: the schedule's placement (interleaved, or the V)."""
        return get_info(self.schedule).layout(self.shape(1))

    def shape(self, iterations: int) -> Shape:
        return Shape(
            stages=self.depth, microbatches=self.microbatches, iterations=iterations,
            chunks=self.chunks, width=self.width, replicas=self.replicas,
            pipelines=self.pipelines, options=dict(self.schedule_options),
        )

    def recompute_stage(self, stage: int) -> bool:
        return bool(self.recompute) and self.recompute[stage]

    # -- constructors and serialisation -----------------------------------------------
    @classmethod
    def uniform(cls, num_blocks: int, depth: int, *, chunks: int = 1, **fields: Any) -> "Plan":
        """Split ``num_blocks`` into ``depth * chunks`` stages of (nearly) equal block counts."""
        count = depth * chunks
        if count < 1 or count > num_blocks:
            raise ValueError(
                f"cannot split {num_blocks} blocks into {count} stages (depth {depth} x chunks "
                f"{chunks}); use between 1 and {num_blocks} stages"
            )
        return cls(num_blocks=num_blocks, stages=uniform_partition(num_blocks, count),
                   chunks=chunks, **fields)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [list(s) for s in self.stages]
        data["replicas"] = list(self.replicas) if self.replicas is not None else None
        data["recompute"] = list(self.recompute)
        data["schedule_options"] = dict(self.schedule_options)
        data["semantics"] = self.semantics.given()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Plan":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"plan has unknown fields {sorted(unknown)}; known: {sorted(known)}")
        if "num_blocks" not in data or "stages" not in data:
            raise ValueError("a plan needs at least 'num_blocks' and 'stages'")
        fields = dict(data)
        fields["stages"] = tuple(tuple(s) for s in fields["stages"])
        if fields.get("replicas") is not None:
            fields["replicas"] = tuple(fields["replicas"])
        fields["recompute"] = tuple(fields.get("recompute", ()))
        return cls(**fields)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        from ..files import read_json

        fix = "give a plan written by `pipeweave plan --out FILE` (or `pipeweave auto --out`)"
        data = read_json(path, what=f"plan file {path}", fix=fix)
        if not isinstance(data, dict):
            raise ValueError(f"plan file {path}: a JSON object was expected, not "
                             f"{type(data).__name__}; {fix}")
        try:
            return cls.from_json(data)
        except TypeError as error:  # a field this version does not know
            raise ValueError(f"plan file {path}: {error}; {fix}") from None
