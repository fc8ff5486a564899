"""Actions: the immutable records a schedule is made of, and their compact text form.

An action is one thing one rank does: a forward (``F``) or backward (``B``) of one
micro-batch on one stage — or the backward split in two (zero-bubble schedules): its
input-gradient part (``I``, what the previous stage waits for) and its weight-gradient part
(``W``, which can run later and fill a bubble) — a point-to-point send/receive of an activation or gradient,
an optimizer step (``U``), a gradient all-reduce among a stage's replicas (``AR``), an
elastic-averaging exchange with a reference model (``AV``), or one of the two halves of a
global gradient check across the stages (``C``, ``V``: :mod:`pipeweave.ir.deps`; zb-h2's
optimizer post-validation, Qi et al. 2024 §4).

Text form (parses back with :func:`parse_action`)::

    {stage}{op}{microbatch}{piece}{@version}{~lookahead}{#pipeline}

    0F3        stage 0, forward of micro-batch 3
    2B5@1      stage 2, backward of micro-batch 5; it must use weight version 1
    2I5 2W5    the same backward split: input gradient (sent on), then weight gradient
    1F7@3~2    forward of micro-batch 7 at version 3, predicting 2 updates ahead (PipeOptim)
    0F0a       first half of micro-batch 0 (AutoPipe's Slicer); ``b`` is the second half
    1SF4 1RF4  send / receive the activation of micro-batch 4 (SF on the producing stage,
               RF on the consuming stage); SB / RB likewise for gradients
    0U@2       optimizer step on stage 0 that produces weight version 2
    0AR@2      all-reduce of stage 0's gradients among its replicas, before update 2
    1C@2       stage 1 adds its gradients' squared norm and NaN flag to the partial state from
               stage 0 and passes it on to stage 2 (the check before update 2)
    1V@2       stage 1 receives the complete state of update 2's check from stage 2, passes it
               to stage 0, and validates its update 2 (keep it, redo it clipped, or undo it)
    3F1#1      stage 3, forward of micro-batch 1 of parallel pipeline 1 (AvgPipe)
"""

from __future__ import annotations

import enum
import re
from typing import Any, NamedTuple

__all__ = ["Op", "Action", "parse_action", "COMPUTE_OPS", "CORE_OPS", "COMM_OPS",
           "GRADIENT_OPS", "WEIGHT_GRADIENT_OPS", "CHECK_OPS"]


class Op(str, enum.Enum):
    """What an action does."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_ACT = "SF"
    RECV_ACT = "RF"
    SEND_GRAD = "SB"
    RECV_GRAD = "RB"
    STEP = "U"
    ALL_REDUCE = "AR"
    AVERAGE = "AV"
    CHECK = "C"
    VALIDATE = "V"

    def __str__(self) -> str:
        return self.value


COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
"""A micro-batch's computation (forward, backward or its halves): busy time, bubbles, the
critical path. The optimizer step is not one of them: it runs once per update, not per
micro-batch."""
CORE_OPS = COMPUTE_OPS | {Op.STEP}
"""The actions that occupy a processor core: a micro-batch's computation and the optimizer step.
The others (sends, receives, all-reduce, averaging, the gradient check) wait on the network;
ranks sharing CPU cores (:mod:`pipeweave.sim.shared_cores`) share them only among these."""
GRADIENT_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_INPUT})
"""The ops that produce a micro-batch's input gradient (what the previous stage waits for)."""
WEIGHT_GRADIENT_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_WEIGHT})
"""The ops that produce a micro-batch's weight gradients (what an update consumes)."""
COMM_OPS = frozenset({Op.SEND_ACT, Op.RECV_ACT, Op.SEND_GRAD, Op.RECV_GRAD})
CHECK_OPS = frozenset({Op.CHECK, Op.VALIDATE})
"""The global gradient check: ``C`` passes the partial state down the stages, ``V`` the complete
state back up (each tagged with the update it checks)."""
_PER_MICROBATCH = COMPUTE_OPS | COMM_OPS
_PIECES = {"": 0, "a": 1, "b": 2}
_PIECE_LETTERS = {v: k for k, v in _PIECES.items()}
_tuple_new = tuple.__new__


class _Fields(NamedTuple):
    op: Op
    stage: int
    microbatch: int | None = None
    piece: int = 0
    version: int | None = None
    lookahead: int = 0
    pipeline: int = 0


class Action(_Fields):
    """One step of one rank's program (an immutable named tuple: cheap to build and hash).

    Attributes:
        op: what the action does.
        stage: the (virtual) stage it belongs to; with chunks, the global chunk index.
        microbatch: the micro-batch index, counted globally across iterations
            (iteration ``k`` owns ``k*M .. k*M+M-1``); ``None`` for ``U``/``AR``/``AV``.
        piece: 0 for a whole micro-batch, 1/2 for its first/second half (Slicer).
        version: for ``F`` the weight version it uses, for ``B`` the version it must match
            (the stashed one), ``I`` and ``W`` as ``B`` (they differentiate the same forward),
            for ``U``/``AR``/``AV`` the version the update produces, for ``C``/``V`` the
            version of the update they check.
        lookahead: for ``F``, how many updates ahead of its ``version`` the runtime predicts
            the weights (0: no prediction). PipeOptim and SpecTrain tag the number of updates
            between the forward and its backward (PipeOptim's ``s``, exact); PipeOptim's
            ``lookahead=<int>`` option tags that constant instead, an approximation the
            validator checks by a weaker rule (:mod:`pipeweave.ir.validate`). For ``B``, how
            far ahead of its ``version`` the backward predicts (SpecTrain; 0 for PipeOptim,
            which runs the backward on the current weights); 0 otherwise. The runtime and the
            simulator read it from here, whatever produced it.
        pipeline: the parallel pipeline (AvgPipe) the action belongs to.
    """

    __slots__ = ()

    def __new__(
        cls,
        op: Op,
        stage: int,
        microbatch: int | None = None,
        piece: int = 0,
        version: int | None = None,
        lookahead: int = 0,
        pipeline: int = 0,
    ) -> "Action":
        if stage < 0:
            raise ValueError(f"stage must be >= 0, got {stage}")
        if (microbatch is None) == (op in _PER_MICROBATCH):
            need = "needs a micro-batch index" if microbatch is None else "takes no micro-batch index"
            raise ValueError(f"{op.value} {need}, got {microbatch}")
        if piece not in _PIECE_LETTERS:
            raise ValueError(f"piece must be 0 (whole), 1 or 2 (halves), got {piece}")
        # what the named tuple's own __new__ does, without the extra call (generators build
        # one Action per step of every rank)
        return _tuple_new(cls, (op, stage, microbatch, piece, version, lookahead, pipeline))

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @property
    def is_comm(self) -> bool:
        return self.op in COMM_OPS

    def with_(self, **changes: Any) -> "Action":
        """A copy with some fields changed (not re-validated: only for annotation fields)."""
        return self._replace(**changes)

    def __str__(self) -> str:
        text = f"{self.stage}{self.op.value}"
        if self.microbatch is not None:
            text += str(self.microbatch)
        text += _PIECE_LETTERS[self.piece]
        if self.version is not None:
            text += f"@{self.version}"
        if self.lookahead:
            text += f"~{self.lookahead}"
        if self.pipeline:
            text += f"#{self.pipeline}"
        return text

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"


_PATTERN = re.compile(
    r"^(?P<stage>\d+)(?P<op>SF|RF|SB|RB|AR|AV|F|B|I|W|U|C|V)(?P<mb>\d+)?(?P<piece>[ab])?"
    r"(?:@(?P<version>\d+))?(?:~(?P<lookahead>\d+))?(?:#(?P<pipeline>\d+))?$"
)


def parse_action(text: str) -> Action:
    """Parse the compact text form back into an :class:`Action` (inverse of ``str``)."""
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(
            f"cannot parse action {text!r}: expected '{{stage}}{{op}}{{microbatch}}[a|b][@version]"
            f"[~lookahead][#pipeline]' with op one of {[op.value for op in Op]}, e.g. '0F3' or '2B5@1'"
        )
    groups = match.groupdict()
    return Action(
        op=Op(groups["op"]),
        stage=int(groups["stage"]),
        microbatch=int(groups["mb"]) if groups["mb"] is not None else None,
        piece=_PIECES[groups["piece"] or ""],
        version=int(groups["version"]) if groups["version"] is not None else None,
        lookahead=int(groups["lookahead"] or 0),
        pipeline=int(groups["pipeline"] or 0),
    )
