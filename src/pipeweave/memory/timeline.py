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
                         and stay until the update (``zero_grad(set_to_none=True)``); that
                         first backward creates them block by block as it frees the micro-
                         batch's own saved tensors, so while it runs only max(0, g_s - a_s)
                         counts
    B            - a_s
    I            + p_s   until its W: the gradients of the parameter holders' outputs, which
                         the W still needs (``pipeweave.split_backward``)
    W            - a_s - p_s
    U            + y_s   just before it, while the gradients are reduced over the stage's
                         ``D`` ranks (its ``AR``, or in a one-copy program the update it
                         precedes): the flattened gradients, the ``D`` gathered copies and
                         their sum, ``(D + 2) g_s``; sharded, FSDP2's reduce-scatter input
                         and output, ``(1 + 1/D) g_s``; then
                 - g_s

and the messages in flight, as the runtime's transport keeps them: a receive's buffer from
when it is posted (the interpreter posts the next ``PREFETCH`` receives ahead) until its
forward or backward consumes it, and a sent input gradient until a later receive proves it
delivered (``ir.deliveries``); a sent activation is the stage's output, already counted.

The peak is the largest sum over the rank's program, and the parts reported are those at
that moment (:func:`.held.held_activations` is the same walk for ``a_s`` alone; with
``x = p = g = 0`` the two agree, which a test checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..ir import GRADIENT_OPS, Action, Op, Schedule, ref
from ..ir.deps import message_of
from ..ir.deliveries import every_delivery_proof

__all__ = ["StageBytes", "PeakMoment", "peak_moments", "graphless_forwards", "PREFETCH",
           "RankTimeline", "analyse_programs", "peak_moments_of"]

PREFETCH = 2
"""Receives the runtime's interpreter posts ahead of need (runtime/execution/interpreter.py)."""

_F, _B, _I, _W, _U = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP
_RF, _RG, _SG = Op.RECV_ACT, Op.RECV_GRAD, Op.SEND_GRAD
_COMPUTE_AND_STEP = frozenset({_F, _B, _I, _W, _U})
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
    received: float = 0.0
    """One activation the stage receives (its input; the gradient it sends back is as big)."""
    sent: float = 0.0
    """One activation the stage sends (its output; the gradient it receives is as big)."""
    reduction: float = 0.0
    """y_s: the gradient reduction's own tensors before an update (module docstring)."""


@dataclass(frozen=True)
class PeakMoment:
    """The changing parts of a rank's memory at its peak."""

    gradients: float
    activations: float
    """Held activations (and pending output gradients of split backwards)."""
    workspace: float
    buffers: float = 0.0
    """Messages in flight (received, not yet consumed; sent, not yet proved delivered)."""

    @property
    def total(self) -> float:
        return self.gradients + self.activations + self.workspace + self.buffers


def peak_moments(schedule: Schedule, stages: Sequence[StageBytes],
                 graphless: frozenset[tuple[int, int | None, int, int]] = frozenset()
                 ) -> list[PeakMoment]:
    """Per rank, the parts at the peak of the walk (module docstring); ``graphless``: the
    forwards ``(stage, micro-batch, piece, pipeline)`` that keep no graph."""
    return peak_moments_of(analyse_programs(schedule), stages, graphless)


@dataclass(frozen=True)
class RankTimeline:
    """What the walk of one rank needs from its program alone, whatever the bytes: a shape's
    analysis, computed once (:func:`analyse_programs`) and reused for every partition."""

    length: int
    """Actions in the rank's (lowered) program."""
    holds: tuple[tuple[int, int, int, bool], ...]
    """Messages in flight: ``(first, stop, stage, sized_as_sent)``: held over program
    positions ``first .. stop - 1``, of the stage's ``sent`` bytes (else ``received``)."""
    steps: tuple[tuple[int, Action], ...]
    """The compute and step actions with their program positions (the rest change nothing
    the walk counts)."""


def analyse_programs(schedule: Schedule) -> list[RankTimeline]:
    """Per rank, the shape-only part of :func:`peak_moments` (lowered schedule)."""
    proofs = every_delivery_proof(schedule)
    return [RankTimeline(length=len(program), holds=_holds(schedule, rank, proofs[rank]),
                         steps=tuple([(p, a) for p, a in enumerate(program)
                                      if a[0] in _COMPUTE_AND_STEP]))
            for rank, program in enumerate(schedule.programs)]


def peak_moments_of(analysis: Sequence[RankTimeline], stages: Sequence[StageBytes],
                    graphless: frozenset[tuple[int, int | None, int, int]] = frozenset()
                    ) -> list[PeakMoment]:
    """:func:`peak_moments` from a shape's analysis: the bytes-weighted pass alone."""
    return [_walk(rank.steps, stages, graphless, _in_flight(rank, stages)) for rank in analysis]


def _holds(schedule: Schedule, rank: int, proofs: Mapping[Action, tuple[Action, ...]]
           ) -> tuple[tuple[int, int, int, bool], ...]:
    """Where each message of ``rank`` is in flight (:attr:`RankTimeline.holds`)."""
    program = schedule.programs[rank]
    end = len(program) - 1
    receives: list[int] = []
    consumer: dict[int, int] = {}  # receive position -> the compute action that uses it
    waiting: dict[tuple[object, ...], int] = {}
    released_at: dict[object, int] = {}  # sent message -> the receive that proves it arrived
    for position, action in enumerate(program):
        op, stage, microbatch, piece, _, _, pipeline = action
        if op is _RF or op is _RG:
            receives.append(position)
            waiting[(op is _RG, stage, microbatch, piece, pipeline)] = position
            for sent in proofs.get(message_of(action), ()):
                released_at[sent] = position
        elif op is _F:
            found = waiting.pop((False, stage, microbatch, piece, pipeline), None)
            if found is not None:
                consumer[found] = position
        elif op in GRADIENT_OPS:
            found = waiting.pop((True, stage, microbatch, piece, pipeline), None)
            if found is not None:
                consumer[found] = position
    # (first, stop, stage, sized as sent): a received gradient is as big as the stage's
    # output, a received activation or a sent gradient as its input
    holds: list[tuple[int, int, int, bool]] = []
    for index, position in enumerate(receives):
        action = program[position]
        # posted once the receive PREFETCH places before it is done (the first ones at once)
        posted = receives[index - PREFETCH] + 1 if index >= PREFETCH else 0
        use = consumer.get(position, end)
        # a forward's input becomes its activation (counted there); a backward's gradient
        # lives while the backward runs
        last = use - 1 if program[use][0] is _F else use
        holds.append((min(posted, position), min(last, end) + 1, action[1], action[0] is _RG))
    for position, action in enumerate(program):
        if action[0] is _SG:
            last = released_at.get(ref(action), end)
            holds.append((position, min(last, end) + 1, action[1], False))
    return tuple(holds)


def _in_flight(rank: RankTimeline, stages: Sequence[StageBytes]) -> list[float]:
    """Bytes of messages in flight while each action of the rank's program runs."""
    changes = [0.0] * (rank.length + 1)  # difference array over positions
    for first, stop, stage, sized_as_sent in rank.holds:
        nbytes = stages[stage].sent if sized_as_sent else stages[stage].received
        changes[first] += nbytes
        changes[stop] -= nbytes
    alive, total = [], 0.0
    for change in changes[:-1]:
        total += change
        alive.append(total)
    return alive


def _walk(steps: Sequence[tuple[int, Action]], stages: Sequence[StageBytes],
          graphless: frozenset[tuple[int, int | None, int, int]],
          in_flight: Sequence[float]) -> PeakMoment:
    held: dict[_Key, float] = {}
    rebuilt: dict[_Key, float] = {}  # what a recomputing backward rebuilds
    pending: dict[_Key, float] = {}
    with_gradients: set[tuple[int, int]] = set()
    gradients = activations = 0.0
    # the best moment's parts and total (PeakMoment.total's sum, in its order), the record
    # built once at the end: the walk weighs every action of every rank of every partition
    best, best_total = (0.0, 0.0, 0.0, 0.0), 0.0
    for position, action in steps:
        op, stage, microbatch, piece, _, _, pipeline = action
        cost = stages[stage]
        key = (stage, microbatch, pipeline)
        workspace = fresh = 0.0
        created = False
        if op is _F:
            share = 0.5 if piece else 1.0
            kept = (cost.inputs if (stage, microbatch, piece, pipeline) in graphless
                    else cost.activations + cost.recorded)
            held[key] = held.get(key, 0.0) + share * kept
            rebuilt[key] = rebuilt.get(key, 0.0) + share * max(0.0, cost.activations - kept)
            activations += share * kept
        elif op in GRADIENT_OPS or op is _W:
            if op is not _I and (stage, pipeline) not in with_gradients:
                # the first backward after an update creates the weight gradients block by
                # block while it frees that micro-batch's saved tensors: the two overlap
                created = True
                fresh = max(0.0, cost.gradients - held.get(key, 0.0) - pending.get(key, 0.0)
                            - rebuilt.get(key, 0.0))
                with_gradients.add((stage, pipeline))
            if op is not _W:
                workspace = cost.workspace + rebuilt.get(key, 0.0)
        elif op is _U and (stage, pipeline) in with_gradients:
            total = gradients + activations + cost.reduction + in_flight[position]
            if total > best_total:
                best, best_total = (gradients, activations, cost.reduction,
                                    in_flight[position]), total
            with_gradients.discard((stage, pipeline))
            gradients -= cost.gradients
        total = gradients + fresh + activations + workspace + in_flight[position]
        if total > best_total:
            best, best_total = (gradients + fresh, activations, workspace,
                                in_flight[position]), total
        if created:
            gradients += cost.gradients
        if op is _I:
            pending[key] = cost.pending
            activations += cost.pending
        elif op is _B or op is _W:
            activations -= held.pop(key, 0.0) + pending.pop(key, 0.0)
            rebuilt.pop(key, None)
    return PeakMoment(*best)


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
