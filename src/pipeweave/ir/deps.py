"""The single statement of what an action waits for.

Every consumer of schedules calls :func:`dependencies`: the validator, the lowering pass that
inserts sends/receives, the simulator, and the runtime's checks. Nothing else encodes the data
flow of a pipeline.

Rules (stage ``s`` of ``S``, micro-batch ``j``, piece ``h``, pipeline ``p``)::

    F(s,j,h)  <- F(s-1,j,h)                 activation from the previous stage
    B(s,j)    <- B(s+1,j)                    gradient from the next stage
    SF(s,j,h) <- F(s,j,h)     RF(s,j,h) <- SF(s-1,j,h)
    SB(s,j)   <- B(s,j)       RB(s,j)   <- SB(s+1,j)

A backward also needs its own stage's forward of the same micro-batch (the stashed
activation); both always run on the same rank (replicas route a micro-batch's forward and
backward to one replica), so that is program order, checked by the validator.

Once a schedule is lowered, a cross-rank producer is replaced by the local receive
(``F(s,j,h) <- RF(s,j,h)``). Program order on one rank is implicit and not listed here;
weight versions (``U`` before the ``F`` that uses it) are same-rank program order too.
``AR`` (all-reduce among replicas) is a collective matched by :func:`collective_key`.
"""

from __future__ import annotations

from .actions import Action, Op
from .layout import Layout

__all__ = ["dependencies", "ref", "collective_key", "producer_rank"]


def ref(action: Action) -> Action:
    """Identity of an action independent of its version annotations.

    Per-micro-batch actions are identified by (op, stage, micro-batch, piece, pipeline);
    updates and collectives also by the version they produce.
    """
    op, stage, microbatch, piece, version, lookahead, pipeline = action
    if microbatch is None:
        return action if lookahead == 0 else action.with_(lookahead=0)
    if version is None and lookahead == 0:
        return action
    return tuple.__new__(Action, (op, stage, microbatch, piece, None, 0, pipeline))


def collective_key(action: Action) -> tuple[Op, int, int | None, int] | None:
    """Key matching the copies of a collective across the ranks that take part in it."""
    if action.op is Op.ALL_REDUCE:
        return (action.op, action.stage, action.version, action.pipeline)
    return None


def producer_rank(action: Action, layout: Layout) -> int:
    """Rank that executes ``action`` (per-micro-batch actions only)."""
    assert action.microbatch is not None, action
    return layout.rank_of(action.stage, action.microbatch)


def dependencies(action: Action, layout: Layout, *, lowered: bool = False) -> tuple[Action, ...]:
    """Actions (as :func:`ref` identities) that must finish before ``action`` can start.

    Args:
        action: the action asking.
        layout: stage placement, to know which producers live on another rank.
        lowered: whether cross-rank producers are reached through local receives.
    """
    op, s, j, h, p = action.op, action.stage, action.microbatch, action.piece, action.pipeline
    last = layout.num_stages - 1
    if op is Op.FORWARD:
        if s == 0:
            return ()
        producer = Action(Op.FORWARD, s - 1, j, h, pipeline=p)
        return (_through_receive(producer, action, layout, Op.RECV_ACT, lowered),)
    if op is Op.BACKWARD:
        if s == last:
            return ()
        producer = Action(Op.BACKWARD, s + 1, j, pipeline=p)
        return (_through_receive(producer, action, layout, Op.RECV_GRAD, lowered),)
    if op is Op.SEND_ACT:
        return (Action(Op.FORWARD, s, j, h, pipeline=p),)
    if op is Op.SEND_GRAD:
        return (Action(Op.BACKWARD, s, j, pipeline=p),)
    if op is Op.RECV_ACT:
        return (Action(Op.SEND_ACT, s - 1, j, h, pipeline=p),)
    if op is Op.RECV_GRAD:
        return (Action(Op.SEND_GRAD, s + 1, j, pipeline=p),)
    return ()


def _through_receive(
    producer: Action, consumer: Action, layout: Layout, recv_op: Op, lowered: bool
) -> Action:
    if not lowered or producer_rank(producer, layout) == producer_rank(consumer, layout):
        return producer
    return Action(recv_op, consumer.stage, consumer.microbatch, producer.piece, pipeline=consumer.pipeline)
