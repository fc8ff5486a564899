"""A rank's memory, by kind: the part fixed for the run (model state) and the peak of the rest.

For a rank hosting stages ``S`` (its chunks, the V's two halves, a replica), in each of ``N``
parallel pipelines, with ``|w_s|`` the parameter bytes of stage ``s``::

    parameters       N * sum |w_s|            (+ sum |w_s| for AvgPipe's reference model)
    gradients        N * sum |w_s|            (trainable parameters; in the model state:
                                               the most the rank ever holds)
    optimizer_state  N * sum state_s          (:mod:`.optimizers`, or a profile's measure)
    weight_versions  sum copies_s * |w_s|     (:func:`.versions.weight_copies`)

A stage sharded over its ``D`` data-parallel ranks with FSDP2 (``Plan.shard``,
:class:`Sharding`) keeps ``1/D`` of its parameters and optimizer state, and gathers whole
parameters while it computes: with ``grad-op`` (ZeRO-2) the stage's from a forward to its
backward, ``|w_s|``; with ``full`` (ZeRO-3) one block at a time, ``max_b |w_b|`` of the
rank's stages; gathering a block also holds the all-gather's input and flat output for a
moment, ``(1 + 1/D) max_b |w_b|`` (``gathered`` below is the sum). Its gradients accumulate unsharded until the update's last backward
reduce-scatters them (one reduction per update), so it holds ``|w_s|`` of them, and
``|w_s| / D`` more once they are reduced::

    parameters       N * sum |w_s| / D  +  gathered
    gradients        N * sum |w_s| (1 + 1/D)
    optimizer_state  N * sum state_s / D

:func:`model_state` is that part (what ``train --memory-limit`` checks before any
activation, and ``auto``'s static bound without the copies); :func:`rank_memory` adds the
moment of the rank's peak, found by walking its program (:mod:`.timeline`): the weight
gradients present then, the activations held, messages in flight and the running backward's
workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from .optimizers import optimizer_state_bytes
from .timeline import PeakMoment

__all__ = ["StageWeights", "Sharding", "ModelState", "RankMemory", "stage_state",
           "model_state", "rank_memory"]

SHARDED_MODES = ("full", "grad-op")


@dataclass(frozen=True)
class StageWeights:
    """The weights of one stage: bytes (a tied parameter once), of them trainable, and the
    trainable parameter tensors (0: not known)."""

    parameters: float
    trainable: float
    tensors: int = 0
    largest_block: float = 0.0
    """Bytes of the stage's largest block: what ZeRO-3 gathers at once (0: not known)."""


@dataclass(frozen=True)
class Sharding:
    """How each stage is held over its data-parallel ranks (``Plan.shard``): ``mode`` ``none``
    (whole on every rank), ``grad-op`` (ZeRO-2) or ``full`` (ZeRO-3), over ``ways`` ranks."""

    mode: str = "none"
    ways: int = 1

    @property
    def sharded(self) -> bool:
        return self.mode in SHARDED_MODES and self.ways > 1

    def gathered(self, weights: Sequence[StageWeights], stages: Sequence[int]) -> float:
        """Whole parameters a rank hosting ``stages`` holds while it computes (docstring)."""
        if not self.sharded or not stages:
            return 0.0
        largest = max(weights[s].largest_block or weights[s].parameters for s in stages)
        # gathering a block: its shard copied into the all-gather's input, the gathered
        # flat output, copied out into the block's whole parameters
        gathering = largest * (1.0 + 1.0 / self.ways)
        if self.mode == "grad-op":
            return sum(weights[s].parameters for s in stages) + gathering
        return largest + gathering


@dataclass(frozen=True)
class ModelState:
    """The part of a rank's memory fixed for the run (module docstring)."""

    parameters: float
    gradients: float
    optimizer_state: float
    weight_versions: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state + self.weight_versions


@dataclass(frozen=True)
class RankMemory:
    """Predicted peak bytes of one rank, by kind (module docstring)."""

    parameters: float
    gradients: float
    optimizer_state: float
    weight_versions: float
    activations: float
    buffers: float
    workspace: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def stage_state(weights: Sequence[StageWeights], optimizer: str) -> list[float]:
    """Per stage: ``optimizer``'s state bytes (:func:`.optimizers.optimizer_state_bytes`)."""
    return [optimizer_state_bytes(optimizer, w.trainable, w.tensors) for w in weights]


def model_state(weights: Sequence[StageWeights], state: Sequence[float],
                hosted: Sequence[Sequence[int]], *, pipelines: int, reference: bool,
                copies: Sequence[int] | None = None,
                sharding: Sharding = Sharding()) -> list[ModelState]:
    """Per rank (``hosted[r]``: the stages of rank ``r``): the model state (module docstring).

    ``state``: per stage, the optimizer's bytes for one pipeline; ``reference``: the schedule
    averages its pipelines against a reference model; ``copies``: per stage, the weight sets
    held besides the live ones (``None``: not counted, e.g. before a schedule is built);
    ``sharding``: the stages held sharded over their data-parallel ranks (module docstring).
    """
    out = []
    share = 1.0 / sharding.ways if sharding.sharded else 1.0
    reduced = share if sharding.sharded else 0.0  # the reduce-scattered gradient shard
    for stages in hosted:
        own = sum(weights[s].parameters for s in stages)
        out.append(ModelState(
            parameters=(pipelines * own * share + sharding.gathered(weights, stages)
                        + (own if reference else 0.0)),
            gradients=pipelines * (1.0 + reduced) * sum(weights[s].trainable for s in stages),
            optimizer_state=pipelines * share * sum(state[s] for s in stages),
            weight_versions=(0.0 if copies is None
                             else sum(copies[s] * weights[s].parameters for s in stages))))
    return out


def rank_memory(state: ModelState, moment: PeakMoment) -> RankMemory:
    """The rank's peak: its model state, with the gradients present at the peak's moment
    rather than the most it holds, and what changes (module docstring)."""
    return RankMemory(parameters=state.parameters, gradients=moment.gradients,
                      optimizer_state=state.optimizer_state,
                      weight_versions=state.weight_versions, activations=moment.activations,
                      buffers=moment.buffers, workspace=moment.workspace)
