"""A rank's memory, by kind: the part fixed for the run (model state) and the peak of the rest.

For a rank hosting stages ``S`` (its chunks, the V's two halves, a replica), in each of ``N``
parallel pipelines, with ``|w_s|`` the parameter bytes of stage ``s``::

    parameters       N * sum |w_s|            (+ sum |w_s| for AvgPipe's reference model)
    gradients        N * sum |w_s|            (trainable parameters; in the model state:
                                               the most the rank ever holds)
    optimizer_state  N * sum state_s          (:mod:`.optimizers`, or a profile's measure)
    weight_versions  sum copies_s * |w_s|     (:func:`.versions.weight_copies`)

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

__all__ = ["StageWeights", "ModelState", "RankMemory", "stage_state", "model_state",
           "rank_memory"]


@dataclass(frozen=True)
class StageWeights:
    """The weights of one stage: bytes (a tied parameter once), of them trainable, and the
    trainable parameter tensors (0: not known)."""

    parameters: float
    trainable: float
    tensors: int = 0


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
                copies: Sequence[int] | None = None) -> list[ModelState]:
    """Per rank (``hosted[r]``: the stages of rank ``r``): the model state (module docstring).

    ``state``: per stage, the optimizer's bytes for one pipeline; ``reference``: the schedule
    averages its pipelines against a reference model; ``copies``: per stage, the weight sets
    held besides the live ones (``None``: not counted, e.g. before a schedule is built).
    """
    out = []
    for stages in hosted:
        own = sum(weights[s].parameters for s in stages)
        out.append(ModelState(
            parameters=pipelines * own + (own if reference else 0.0),
            gradients=pipelines * sum(weights[s].trainable for s in stages),
            optimizer_state=pipelines * sum(state[s] for s in stages),
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
