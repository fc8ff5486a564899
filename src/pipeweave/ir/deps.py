"""The single statement of what an action waits for.

Every consumer of schedules calls :func:`dependencies`: the validator, the lowering pass that
inserts sends/receives, the simulator, and the runtime's checks. Nothing else encodes the data
flow of a pipeline.

Rules (stage ``s`` of ``S``, micro-batch ``j``, piece ``h``, pipeline ``p``)::

    F(s,j,h)  <- F(s-1,j,h)                 activation from the previous stage
    B(s,j)    <- B(s+1,j)                    gradient from the next stage
    I(s,j)    <- B(s+1,j)                    likewise: I is B's input-gradient part
    SF(s,j,h) <- F(s,j,h)     RF(s,j,h) <- SF(s-1,j,h)
    SB(s,j)   <- B(s,j)       RB(s,j)   <- SB(s+1,j)

A split backward (zero-bubble schedules) is ``I`` then ``W``: ``I`` computes the gradient of
the stage input, which is what the previous stage waits for, so it *is* the micro-batch's
producer of that gradient: :func:`ref` gives ``I(s,j)`` the identity ``B(s,j)``, and every rule
above that names ``B`` as a producer is met by an ``I`` just the same (stage ``s`` may split
while ``s+1`` does not, or the other way round). ``W`` computes the weight gradients; no other
stage waits for it, and the update that consumes them comes after it on the same rank.

A backward (``B`` or ``I``) also needs its own stage's forward of the same micro-batch (the
stashed activation), and ``W`` its ``I``; they always run on the same rank (replicas route a
micro-batch's forward and backward to one replica), so that is program order, checked by
the validator.

A global gradient check (zb-h2's optimizer post-validation, :mod:`pipeweave.schedules.global_check`)
is a chain down the stages and back, one small state per update ``v``::

    C(s)@v    <- C(s-1)@v                    the partial state of stages 0..s-1
    V(s)@v    <- V(s+1)@v                    the complete state, coming back
    V(S-1)@v  <- C(S-1)@v                    the last stage completes it

The state is a few numbers that the runtime sends beside the pipeline's messages, so lowering
inserts no send/receive for it; the walk charges a cross-rank edge the link's latency.

Once a schedule is lowered, a cross-rank producer is replaced by the local receive
(``F(s,j,h) <- RF(s,j,h)``). Program order on one rank is implicit and not listed here;
weight versions (``U`` before the ``F`` that uses it) are same-rank program order too.
``AR`` (all-reduce among replicas) is a collective matched by :func:`collective_key`.
"""

from __future__ import annotations

from .actions import Action, Op
from .layout import Layout

__all__ = ["dependencies", "ref", "collective_key", "producer_rank", "receiver", "message_of",
           "destination"]


def ref(action: Action) -> Action:
    """Identity of an action independent of its version annotations.

    Per-micro-batch actions are identified by (op, stage, micro-batch, piece, pipeline),
    with ``I`` identified as ``B`` (the producer of the input gradient, module docstring);
    updates and collectives also by the version they produce.
    """
    op, stage, microbatch, piece, version, lookahead, pipeline = action
    if microbatch is None:
        return action if lookahead == 0 else action.with_(lookahead=0)
    if op is _I:
        op = _B
    elif version is None and lookahead == 0:
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
    # Hot path of the simulator (called once per action): the producers are built with
    # ``tuple.__new__`` because their fields are derived from a valid action, so the checks
    # in ``Action.__new__`` cannot fail; enum members are read from module constants because
    # ``Op.FORWARD`` is a slow class-attribute lookup on Python 3.11.
    op, s, j, h, _, _, p = action
    if op is _F:
        if s == 0:
            return ()
        producer = _new(Action, (_F, s - 1, j, h, None, 0, p))
        if lowered:
            producer = _through_receive(producer, action, layout, _RF)
        return (producer,)
    if op is _B or op is _I:
        if s == len(layout.stage_ranks) - 1:
            return ()
        producer = _new(Action, (_B, s + 1, j, 0, None, 0, p))
        if lowered:
            producer = _through_receive(producer, action, layout, _RB)
        return (producer,)
    if op is _SF:
        return (_new(Action, (_F, s, j, h, None, 0, p)),)
    if op is _SB:
        return (_new(Action, (_B, s, j, 0, None, 0, p)),)
    if op is _RF:
        return (Action(_SF, s - 1, j, h, pipeline=p),)
    if op is _RB:
        return (_new(Action, (_SB, s + 1, j, 0, None, 0, p)),)
    if op is _C:
        return () if s == 0 else (Action(_C, s - 1, version=action.version, pipeline=p),)
    if op is _V:
        if s == len(layout.stage_ranks) - 1:
            return (Action(_C, s, version=action.version, pipeline=p),)
        return (Action(_V, s + 1, version=action.version, pipeline=p),)
    return ()


_new = tuple.__new__
_F, _B, _I, _SF, _RF, _SB, _RB, _C, _V = (
    Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.SEND_ACT, Op.RECV_ACT, Op.SEND_GRAD,
    Op.RECV_GRAD, Op.CHECK, Op.VALIDATE
)


def _through_receive(producer: Action, consumer: Action, layout: Layout, recv_op: Op) -> Action:
    ranks = layout.stage_ranks
    j = consumer.microbatch
    assert j is not None, consumer
    producer_ranks, consumer_ranks = ranks[producer.stage], ranks[consumer.stage]
    if producer_ranks[j % len(producer_ranks)] == consumer_ranks[j % len(consumer_ranks)]:
        return producer
    return _new(Action, (recv_op, consumer.stage, j, producer.piece, None, 0, consumer.pipeline))


def receiver(send: Action, layout: Layout) -> tuple[Action, int]:
    """The receive that consumes ``send`` and the rank it runs on.

    The inverse of the receive rules in :func:`dependencies`, which it checks.
    """
    assert send.microbatch is not None, send
    if send.op is Op.SEND_ACT:
        recv = Action(Op.RECV_ACT, send.stage + 1, send.microbatch, send.piece, pipeline=send.pipeline)
    elif send.op is Op.SEND_GRAD:
        recv = Action(Op.RECV_GRAD, send.stage - 1, send.microbatch, pipeline=send.pipeline)
    else:
        raise ValueError(f"{send} is not a send")
    assert dependencies(recv, layout, lowered=True) == (ref(send),), (send, recv)
    return recv, producer_rank(recv, layout)


def message_of(receive: Action) -> Action:
    """The send (its :func:`ref` identity) that ``receive`` consumes: the one action
    :func:`dependencies` gives it, lowered, without the layout (hot in the memory model's
    per-shape analysis; ``tests/ir/test_messages.py`` checks the two agree)."""
    op, s, j, h, _, _, p = receive
    if op is _RF:
        return _new(Action, (_SF, s - 1, j, h, None, 0, p))
    assert op is _RB, receive
    return _new(Action, (_SB, s + 1, j, 0, None, 0, p))


def destination(send: Action, layout: Layout) -> int:
    """The rank that receives ``send``: :func:`receiver`'s rank, without building the
    receive."""
    op, s, j, _, _, _, _ = send
    assert j is not None and (op is _SF or op is _SB), send
    return layout.rank_of(s + 1 if op is _SF else s - 1, j)
