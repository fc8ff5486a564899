"""The moment of a rank's memory peak, found by walking its program (the schedule's action list).

What changes over an iteration, per stage ``s`` of the rank and per micro-batch::

    F            + a_s   held until its B (or W): the saved tensors and the output (on a
                         stage that splits its backward, also r_s, the parameter holders'
                         outputs autograd does not save), or only the input i_s when the
                         forward keeps no graph (recomputation; a forward on predicted
                         weights that the backward recomputes, PipeOptim and SpecTrain's
                         default); a Slicer half holds half
    B / I        + x_s   while it runs: the backward's own tensors (gradients of the stage's
                         intermediate values), plus the rebuilt a_s when it recomputes
                 + g_s   the weight gradients appear at the first B (or W) after an update
                         and stay until the update (``zero_grad(set_to_none=True)``)
    B            - a_s
    I            + p_s   until its W: the gradients of the parameter holders' outputs, which
                         the W still needs (``pipeweave.split_backward``)
    W            - a_s - p_s
    U            - g_s

The peak is the largest sum over the rank's program, and the parts reported are those at
that moment (``sim.metrics.peak_activations`` is the same walk for ``a_s`` alone; with
``x = p = g = 0`` the two agree, which a test checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import GRADIENT_OPS, Op, Schedule

__all__ = ["StageBytes", "PeakMoment", "peak_moments", "graphless_forwards"]

_F, _B, _I, _W, _U = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP
_Key = tuple[int, int | None, int]  # (stage, micro-batch, pipeline)


@dataclass(frozen=True)
class StageBytes:
    """What one micro-batch (or the stage's weights) costs on a stage, in bytes."""

    gradients: float
    """g_s: the stage's weight gradients (its parameters' size)."""
    activations: float
    """a_s: held from a forward that keeps its graph to its backward."""
    inputs: float
    """i_s: held instead when the forward keeps no graph (the stage's input)."""
    pending: float = 0.0
    """p_s: held from a split backward's I to its W besides a_s."""
    recorded: float = 0.0
    """r_s: held from a forward that keeps its graph to its B or W besides a_s, on a stage
    that splits its backward."""
    workspace: float = 0.0
    """x_s: the backward's own tensors while it runs."""


@dataclass(frozen=True)
class PeakMoment:
    """The changing parts of a rank's memory at its peak."""

    gradients: float
    activations: float
    """Held activations (and pending output gradients of split backwards)."""
    workspace: float

    @property
    def total(self) -> float:
        return self.gradients + self.activations + self.workspace


def peak_moments(schedule: Schedule, stages: Sequence[StageBytes],
                 graphless: frozenset[tuple[int, int | None, int, int]] = frozenset()
                 ) -> list[PeakMoment]:
    """Per rank, the parts at the peak of the walk (module docstring); ``graphless``: the
    forwards ``(stage, micro-batch, piece, pipeline)`` that keep no graph."""
    return [_walk(program, stages, graphless) for program in schedule.programs]


def _walk(program: Sequence[tuple[object, ...]], stages: Sequence[StageBytes],
          graphless: frozenset[tuple[int, int | None, int, int]]) -> PeakMoment:
    held: dict[_Key, float] = {}
    rebuilt: dict[_Key, float] = {}  # what a recomputing backward rebuilds
    pending: dict[_Key, float] = {}
    with_gradients: set[tuple[int, int]] = set()
    gradients = activations = 0.0
    best = PeakMoment(0.0, 0.0, 0.0)
    for action in program:
        op, stage, microbatch, piece, pipeline = (action[0], action[1], action[2], action[3],
                                                   action[6])
        assert isinstance(stage, int) and isinstance(pipeline, int) and isinstance(piece, int)
        assert microbatch is None or isinstance(microbatch, int)
        cost = stages[stage]
        key = (stage, microbatch, pipeline)
        workspace = 0.0
        if op is _F:
            share = 0.5 if piece else 1.0
            kept = (cost.inputs if (stage, microbatch, piece, pipeline) in graphless
                    else cost.activations + cost.recorded)
            held[key] = held.get(key, 0.0) + share * kept
            rebuilt[key] = rebuilt.get(key, 0.0) + share * max(0.0, cost.activations - kept)
            activations += share * kept
        elif op in GRADIENT_OPS or op is _W:
            if op is not _I and (stage, pipeline) not in with_gradients:
                with_gradients.add((stage, pipeline))
                gradients += cost.gradients
            if op is not _W:
                workspace = cost.workspace + rebuilt.get(key, 0.0)
        elif op is _U and (stage, pipeline) in with_gradients:
            with_gradients.discard((stage, pipeline))
            gradients -= cost.gradients
        if gradients + activations + workspace > best.total:
            best = PeakMoment(gradients, activations, workspace)
        if op is _I:
            pending[key] = cost.pending
            activations += cost.pending
        elif op is _B or op is _W:
            activations -= held.pop(key, 0.0) + pending.pop(key, 0.0)
            rebuilt.pop(key, None)
    return best


def graphless_forwards(schedule: Schedule, *, recompute: Sequence[bool],
                       backward: str) -> frozenset[tuple[int, int | None, int, int]]:
    """The forwards ``(stage, micro-batch, piece, pipeline)`` that keep no graph for their
    backward, as :mod:`pipeweave.runtime.execution.weights` decides: every forward of a
    recomputed stage; a forward on predicted weights, or one whose backward predicts
    (SpecTrain), unless ``backward == "graph"`` keeps the predicted forward's graph; a
    backward tagged with a newer version than its forward's (PipeOptim without prediction),
    which recomputes at the current weights."""
    found: set[tuple[int, int | None, int, int]] = set()
    for program in schedule.programs:
        live: dict[tuple[int, int], int] = {}
        forwards: dict[_Key, list[tuple[int, int, int]]] = {}  # -> (piece, version, lookahead)
        for op, stage, microbatch, piece, version, lookahead, pipeline in program:
            where = (stage, pipeline)
            now = live.setdefault(where, 0)
            if op is _U:
                live[where] = version if version is not None else now + 1
            elif op is _F:
                forwards.setdefault((stage, microbatch, pipeline), []).append(
                    (piece, now if version is None else version, lookahead))
            elif op in GRADIENT_OPS:
                for f_piece, f_version, f_lookahead in forwards.pop((stage, microbatch, pipeline),
                                                                    []):
                    if recompute[stage]:
                        graph = False
                    elif f_lookahead or lookahead:
                        graph = backward == "graph" and not lookahead
                    else:
                        graph = not (backward == "recompute" and version is not None
                                     and version > f_version)
                    if not graph:
                        found.add((stage, microbatch, f_piece, pipeline))
    return frozenset(found)
