"""When a rank posts its receives: early, so transfers overlap compute, and on NCCL in an
order that cannot deadlock.

The interpreter asks its policy, around each action, which receives (program positions) to
post now; the transport posts them (``Transport.prefetch``).

* :class:`WindowPosting` (gloo, the single-process executor): the next two receives of the
  program, the window moving at each receive. A gloo send is buffered (it completes
  without its receive), so any order of posting is safe.
* :class:`OrderedPosting` (NCCL, ``Transport.rendezvous``): a large NCCL message moves only
  while its send and receive both run, and a rank's operations run one group after
  another in posting order (:mod:`pipeweave.ir.rendezvous`). The window's order deadlocks
  there: in 1F1B's steady state each rank has a receive posted ahead of the send its peer
  waits for::

      rank 0:  ... | recv grad 0 | send act 2 ...     (recv posted early, two ahead)
      rank 1:  ... | recv act 2  | send grad 0 ...    each waits behind its own receive

  So every rank posts its sends and receives in the one order of messages all ranks derive
  from the schedule (:func:`pipeweave.ir.message_order.message_order`): before a send, every
  receive that comes before it in that order; before a receive is used, those before it;
  after each action, the next receives in the order (up to four waiting) until the next send.
  Receives are still posted early, as far as the order allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...ir import Action, Op

__all__ = ["WindowPosting", "OrderedPosting", "WINDOW", "ORDERED_WINDOW"]

WINDOW = 2
"""Receives posted ahead of need (waiting to be used), so transfers overlap with compute."""

ORDERED_WINDOW = 4
"""At most this many receives waiting to be used in :class:`OrderedPosting`, where the
message order, not the order of use, says which come next: with two chunks (wpipe at P = 3,
M = 6) two slots went to receives used later, and 25 of 180 receives were posted only when
used (10 with four slots, as many as gloo's window of two). Each slot holds a buffer of
one message."""

_RECEIVES = (Op.RECV_ACT, Op.RECV_GRAD)
Routes = Mapping[int, tuple[Action, int]]
"""``position -> (message, peer rank)`` of every send and receive of a program."""


class WindowPosting:
    """The next :data:`WINDOW` receives of the program; the window only moves, and a receive
    only becomes postable (its kind's header known), at a receive."""

    def __init__(self, program: Sequence[Action], start: int) -> None:
        self._receives = [p for p, a in enumerate(program) if p >= start and a.op in _RECEIVES]
        self._program = program
        self._next, self._moved = 0, True

    def before(self, position: int) -> list[int]:
        """Receives to post before the action at ``position`` runs."""
        if not self._moved:
            return []
        self._moved = False
        return self._receives[self._next:self._next + WINDOW]

    def after(self, position: int) -> list[int]:
        """Receives to post after the action at ``position`` ran."""
        if self._program[position].op in _RECEIVES:
            self._next += 1
            self._moved = True
        return []

    def restart(self, position: int) -> None:
        """Continue at ``position`` (an earlier one: a global check's redo)."""
        self._next = next((i for i, p in enumerate(self._receives) if p >= position),
                          len(self._receives))
        self._moved = True


class OrderedPosting:
    """Sends and receives in the schedule's message order (module docstring)."""

    def __init__(self, program: Sequence[Action], start: int, routes: Routes,
                 order: Mapping[Action, int]) -> None:
        self._program = program
        self._whole = sorted(routes, key=lambda p: order[routes[p][0]])
        """This rank's sends and receives (positions) in the message order."""
        self._begin(start)

    def _begin(self, start: int) -> None:
        """Post from ``start`` on, as a run that begins there."""
        self._sequence = [p for p in self._whole if p >= start]
        self._index = {p: i for i, p in enumerate(self._sequence)}
        self._receive = [self._program[p].op in _RECEIVES for p in self._sequence]
        self._cursor = 0
        """The first entry of the sequence not posted yet."""
        self._waiting = 0
        """Receives posted and not used yet."""

    def before(self, position: int) -> list[int]:
        """Every receive before this send or receive in the order, not posted yet."""
        index = self._index.get(position)
        if index is None or index < self._cursor:
            return []
        due = self._sequence[self._cursor:index]
        assert all(self._receive[i] for i in range(self._cursor, index)), (
            f"a send before position {position} in the message order is not posted yet")
        self._cursor = index + 1  # the action posts itself (a send, or a receive not prefetched)
        self._waiting += len(due) + (1 if self._receive[index] else 0)
        return due

    def after(self, position: int) -> list[int]:
        """The receives next in the order, until the next send or :data:`ORDERED_WINDOW`
        waiting."""
        if self._program[position].op in _RECEIVES and position in self._index:
            self._waiting -= 1
        due: list[int] = []
        while (self._cursor < len(self._sequence) and self._receive[self._cursor]
               and self._waiting < ORDERED_WINDOW):
            due.append(self._sequence[self._cursor])
            self._cursor += 1
            self._waiting += 1
        return due

    def restart(self, position: int) -> None:
        """Continue at ``position`` (a global check's redo sends its messages again: they
        are posted again from there, in the order, as by a run that begins there)."""
        self._begin(position)
