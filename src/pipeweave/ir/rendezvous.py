"""A model of NCCL point-to-point semantics: do the ranks' posted sends and receives complete?

What NCCL does with what a rank posts (``isend``/``irecv``/``batch_isend_irecv`` through
torch's ProcessGroupNCCL), reduced to what decides progress:

* a rank's operations go to a *channel* (a communicator and its one CUDA stream). With the
  process group bound to a device (``init_process_group(device_id=...)``, which pipeweave
  does) every point-to-point operation, batched or not, goes to the group's one
  communicator; without it a lone ``isend``/``irecv`` gets a two-rank communicator of its
  pair and a batch the group's (so a lone receive never matches a batched send);
* each ``batch_isend_irecv`` (or lone operation) is one *group*, one kernel on the channel's
  stream: groups run in posting order, the next starts when the previous one has finished;
* NCCL has no tags: the k-th send from ``a`` to ``b`` on a channel meets the k-th receive
  on ``b`` from ``a`` on that channel; the tags recorded here only check that the message is
  the one the receiver meant;
* worst case, rendezvous: a message larger than NCCL's buffers moves only while the send and
  its receive both run, i.e. both sit in the running (head) group of their rank's channel. An
  operation finishes when it met its partner; a group when all its operations have.

:func:`run_posted` plays this out on the groups each rank posted, in posting order, and says
whether every group finishes, or which ranks wait for which operation, and the cycle among
them. The order of a rank's own streams (the comm stream waiting for a receive before a
later post, :mod:`pipeweave.runtime.communication.streams`) is left out: on one channel the
channel's own order already holds it (what a rank waits for was posted before).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["P2P", "Group", "Outcome", "run_posted"]


@dataclass(frozen=True)
class P2P:
    """One posted operation: a send to ``peer`` or a receive from it, for message ``tag``."""

    send: bool
    peer: int
    tag: int

    def __str__(self) -> str:
        return f"send {self.tag} to {self.peer}" if self.send else f"recv {self.tag} from {self.peer}"


@dataclass(frozen=True)
class Group:
    """Operations posted together (one ``batch_isend_irecv``, or one lone operation)."""

    ops: tuple[P2P, ...]
    channel: str = "group"
    """The communicator (and its stream) the group runs on."""

    def __post_init__(self) -> None:
        if not self.ops:
            raise ValueError("a group needs at least one operation; drop empty groups")


@dataclass(frozen=True)
class Outcome:
    """What became of the posted groups."""

    completed: bool
    waits: dict[int, str] = field(default_factory=dict)
    """Each stuck rank: what its running group waits for."""
    cycle: tuple[int, ...] = ()
    """Ranks that wait for one another in a ring (each for the next), if there is one."""
    mismatch: str | None = None
    """A send met a receive meant for another message (NCCL would deliver it there)."""

    def __str__(self) -> str:
        if self.mismatch is not None:
            return f"mismatch: {self.mismatch}"
        if self.completed:
            return "every group completed"
        ring = " -> ".join(str(r) for r in (*self.cycle, *self.cycle[:1]))
        lines = [f"rank {r}: {what}" for r, what in sorted(self.waits.items())]
        return "deadlock" + (f" (cycle {ring})" if ring else "") + ":\n  " + "\n  ".join(lines)


_Queue = tuple[int, str]  # (rank, channel)
_Slot = tuple[int, int]  # (group index in its queue, op index in the group)


def run_posted(posted: Mapping[int, Sequence[Group]]) -> Outcome:
    """Run every rank's ``posted`` groups (in posting order) under rendezvous semantics."""
    queues: dict[_Queue, list[Group]] = {}
    for rank, groups in posted.items():
        for group in groups:
            queues.setdefault((rank, group.channel), []).append(group)
    partners = _partners(queues, *_number(queues))
    done: dict[_Queue, list[list[bool]]] = {
        q: [[False] * len(g.ops) for g in groups] for q, groups in queues.items()}
    head = {q: 0 for q in queues}
    moved = True
    while moved:
        moved = False
        for queue in queues:
            if head[queue] == len(queues[queue]):
                continue
            mismatch = _match_head(queue, queues, partners, done, head)
            if mismatch is not None:
                return Outcome(False, mismatch=mismatch)
            while head[queue] < len(queues[queue]) and all(done[queue][head[queue]]):
                head[queue] += 1
                moved = True
    stuck = [q for q in queues if head[q] < len(queues[q])]
    if not stuck:
        return Outcome(True)
    return _deadlock(stuck, queues, partners, done, head)


_Where = dict[tuple[str, int, int, bool, int], tuple[_Queue, _Slot]]
_Partners = dict[tuple[_Queue, _Slot], tuple[_Queue, _Slot] | None]


def _number(queues: Mapping[_Queue, list[Group]]) -> tuple[_Where, dict[tuple[_Queue, _Slot], int]]:
    """Where the k-th operation of each direction on each channel sits
    (``(channel, src, dst, is_send, k) -> (queue, slot)``), and each operation's k."""
    where: _Where = {}
    ordinals: dict[tuple[_Queue, _Slot], int] = {}
    counts: dict[tuple[str, int, int, bool], int] = {}
    for (rank, channel), groups in queues.items():
        for g, group in enumerate(groups):
            for o, op in enumerate(group.ops):
                src, dst = (rank, op.peer) if op.send else (op.peer, rank)
                key = (channel, src, dst, op.send)
                k = counts.get(key, 0)
                counts[key] = k + 1
                where[(*key, k)] = ((rank, channel), (g, o))
                ordinals[((rank, channel), (g, o))] = k
    return where, ordinals


def _partners(queues: Mapping[_Queue, list[Group]], where: _Where,
              ordinals: Mapping[tuple[_Queue, _Slot], int]) -> _Partners:
    """Each operation's partner (the peer's operation it meets), None if never posted."""
    partners: _Partners = {}
    for (queue, slot), k in ordinals.items():
        rank, channel = queue
        op = queues[queue][slot[0]].ops[slot[1]]
        src, dst = (rank, op.peer) if op.send else (op.peer, rank)
        partners[(queue, slot)] = where.get((channel, src, dst, not op.send, k))
    return partners


def _match_head(queue: _Queue, queues: Mapping[_Queue, list[Group]], partners: _Partners,
                done: dict[_Queue, list[list[bool]]], head: Mapping[_Queue, int]) -> str | None:
    """Complete every operation of ``queue``'s running group whose partner runs too."""
    g = head[queue]
    for o, op in enumerate(queues[queue][g].ops):
        if done[queue][g][o]:
            continue
        found = partners[(queue, (g, o))]
        if found is None:
            continue
        other, (pg, po) = found
        if head[other] != pg:
            continue
        theirs = queues[other][pg].ops[po]
        if theirs.tag != op.tag:
            return f"rank {queue[0]}'s {op} met rank {other[0]}'s {theirs}"
        done[queue][g][o] = done[other][pg][po] = True
    return None


def _deadlock(stuck: Sequence[_Queue], queues: Mapping[_Queue, list[Group]], partners: _Partners,
              done: Mapping[_Queue, list[list[bool]]], head: Mapping[_Queue, int]) -> Outcome:
    """Each stuck rank's first unfinished operation, and whom it waits for."""
    waits: dict[int, str] = {}
    waits_for: dict[int, int] = {}
    for queue in stuck:
        g = head[queue]
        o = done[queue][g].index(False)
        op = queues[queue][g].ops[o]
        found = partners[(queue, (g, o))]
        if found is None:
            waits.setdefault(queue[0], f"group {g} ({queue[1]}): {op}, which rank {op.peer} "
                                       f"never posts")
            continue
        other, (pg, _) = found
        blocker = queues[other][head[other]].ops[0] if head[other] < len(queues[other]) else None
        waits.setdefault(queue[0], f"group {g} ({queue[1]}): {op}; rank {other[0]} posted its "
                                   f"match in group {pg}, behind its running group "
                                   f"{head[other]} ({blocker})")
        waits_for.setdefault(queue[0], other[0])
    return Outcome(False, waits=waits, cycle=_cycle(waits_for))


def _cycle(waits_for: Mapping[int, int]) -> tuple[int, ...]:
    for start in sorted(waits_for):
        path = [start]
        while (nxt := waits_for.get(path[-1])) is not None:
            if nxt in path:
                return tuple(path[path.index(nxt):])
            path.append(nxt)
    return ()
