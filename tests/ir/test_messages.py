"""The message shortcuts the memory model's per-shape analysis runs on (``ir.deps.message_of``,
``ir.deps.destination``) agree with ``dependencies`` and ``receiver`` on every receive and
send of every registered schedule, and the delivery proofs built on them equal a brute force
of their definition (a send is delivered once its sender receives a message its destination
sent after receiving it)."""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Op, Schedule, dependencies, ref
from pipeweave.ir.deliveries import every_delivery_proof
from pipeweave.ir.deps import destination, message_of, producer_rank, receiver
from pipeweave.schedules import Shape, available_schedules, lowered_schedule

NAMES = [info.name for info in available_schedules()]
_RECEIVES, _SENDS = (Op.RECV_ACT, Op.RECV_GRAD), (Op.SEND_ACT, Op.SEND_GRAD)


def _lowered(name: str) -> list[Schedule]:
    info = next(i for i in available_schedules() if i.name == name)
    found = []
    for stages, microbatches, width in ((2, 4, 1), (3, 6, 1), (4, 8, 1), (2, 4, 2), (4, 5, 1)):
        try:
            found.append(lowered_schedule(name, Shape(
                stages=stages, microbatches=microbatches, chunks=info.default_chunks,
                width=width)))
        except ValueError:
            continue
    return found


def _brute_proofs(schedule: Schedule, rank: int) -> dict[Action, tuple[Action, ...]]:
    where: dict[Action, tuple[int, int]] = {}  # message -> (receiving rank, position)
    sent_at: dict[Action, int] = {}
    for r, program in enumerate(schedule.programs):
        for position, action in enumerate(program):
            if action.op in _RECEIVES:
                where[message_of(action)] = (r, position)
            elif action.op in _SENDS:
                sent_at[ref(action)] = position
    mine = [ref(a) for a in schedule.programs[rank] if a.op in _SENDS]
    done: set[Action] = set()
    proofs: dict[Action, tuple[Action, ...]] = {}
    for action in schedule.programs[rank]:
        if action.op not in _RECEIVES:
            continue
        message = message_of(action)
        src = producer_rank(message, schedule.layout)
        new = sorted((where[s][1], s) for s in mine if s not in done
                     and where[s][0] == src and where[s][1] < sent_at[message])
        if new:
            proofs[message] = tuple(s for _, s in new)
            done.update(s for _, s in new)
    return proofs


@pytest.mark.parametrize("name", NAMES)
def test_shortcuts_and_proofs_agree(name: str) -> None:
    schedules = _lowered(name)
    assert schedules, name
    for schedule in schedules:
        layout = schedule.layout
        for program in schedule.programs:
            for action in program:
                if action.op in _RECEIVES:
                    assert (message_of(action),) == dependencies(action, layout, lowered=True)
                elif action.op in _SENDS:
                    assert destination(action, layout) == receiver(action, layout)[1]
        proofs = every_delivery_proof(schedule)
        assert any(proofs), name
        assert proofs == [_brute_proofs(schedule, r) for r in range(schedule.num_ranks)], name
