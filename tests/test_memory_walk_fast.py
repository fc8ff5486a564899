"""The memory model's per-rank walks (``memory/timeline.py``: the messages in flight,
``_holds``, and the bytes-weighted walk, ``_walk``), written for speed, give exactly what
their first versions (kept here as the reference) gave: every registered schedule, several
shapes, random bytes per stage, with and without recomputation and split backwards."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from pipeweave.ir import GRADIENT_OPS, Action, Op, Schedule, dependencies, ref
from pipeweave.ir.deliveries import every_delivery_proof
from pipeweave.memory import timeline
from pipeweave.memory.timeline import (PREFETCH, PeakMoment, StageBytes, analyse_programs,
                                       graphless_forwards, peak_moments_of)
from pipeweave.schedules import Shape, available_schedules, lowered_schedule

NAMES = [info.name for info in available_schedules()]
_F, _B, _I, _W, _U = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP
_Key = tuple[int, int | None, int]


def _reference_holds(schedule: Schedule, rank: int, proofs: Mapping[Action, tuple[Action, ...]]
           ) -> tuple[tuple[int, int, int, bool], ...]:
    """Where each message of ``rank`` is in flight (:attr:`RankTimeline.holds`)."""
    program = schedule.programs[rank]
    sized_as_sent = {Op.RECV_ACT: False, Op.RECV_GRAD: True, Op.SEND_GRAD: False}
    receives = [p for p, a in enumerate(program) if a.op in (Op.RECV_ACT, Op.RECV_GRAD)]
    consumer: dict[int, int] = {}  # receive position -> the compute action that uses it
    waiting: dict[tuple[object, ...], int] = {}
    released_at: dict[object, int] = {}  # sent message -> the receive that proves it arrived
    for position, action in enumerate(program):
        key = (action.stage, action.microbatch, action.piece, action.pipeline)
        if action.op in (Op.RECV_ACT, Op.RECV_GRAD):
            waiting[(action.op is Op.RECV_GRAD, *key)] = position
            (message,) = dependencies(action, schedule.layout, lowered=True)
            for sent in proofs.get(message, ()):
                released_at[sent] = position
        elif action.op is Op.FORWARD and (False, *key) in waiting:
            consumer[waiting.pop((False, *key))] = position
        elif action.op in GRADIENT_OPS and (True, *key) in waiting:
            consumer[waiting.pop((True, *key))] = position
    holds: list[tuple[int, int, int, bool]] = []

    def hold(first: int, last: int, action: Action) -> None:
        holds.append((first, min(last, len(program) - 1) + 1, action.stage,
                      sized_as_sent[action.op]))

    for index, position in enumerate(receives):
        action = program[position]
        # posted once the receive PREFETCH places before it is done (the first ones at once)
        posted = receives[index - PREFETCH] + 1 if index >= PREFETCH else 0
        use = consumer.get(position, len(program) - 1)
        # a forward's input becomes its activation (counted there); a backward's gradient
        # lives while the backward runs
        last = use - 1 if program[use].op is Op.FORWARD else use
        hold(min(posted, position), last, action)
    for position, action in enumerate(program):
        if action.op is Op.SEND_GRAD:
            hold(position, released_at.get(ref(action), len(program) - 1), action)
    return tuple(holds)


def _reference_walk(steps: Sequence[tuple[int, Action]], stages: Sequence[StageBytes],
          graphless: frozenset[tuple[int, int | None, int, int]],
          in_flight: Sequence[float]) -> PeakMoment:
    held: dict[_Key, float] = {}
    rebuilt: dict[_Key, float] = {}  # what a recomputing backward rebuilds
    pending: dict[_Key, float] = {}
    with_gradients: set[tuple[int, int]] = set()
    gradients = activations = 0.0
    best = PeakMoment(0.0, 0.0, 0.0)
    for position, action in steps:
        op, stage, microbatch, piece, pipeline = (action[0], action[1], action[2], action[3],
                                                   action[6])
        assert isinstance(stage, int) and isinstance(pipeline, int) and isinstance(piece, int)
        assert microbatch is None or isinstance(microbatch, int)
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
            reducing = PeakMoment(gradients, activations, cost.reduction, in_flight[position])
            if reducing.total > best.total:
                best = reducing
            with_gradients.discard((stage, pipeline))
            gradients -= cost.gradients
        moment = PeakMoment(gradients + fresh, activations, workspace, in_flight[position])
        if created:
            gradients += cost.gradients
        if moment.total > best.total:
            best = moment
        if op is _I:
            pending[key] = cost.pending
            activations += cost.pending
        elif op is _B or op is _W:
            activations -= held.pop(key, 0.0) + pending.pop(key, 0.0)
            rebuilt.pop(key, None)
    return best


def _bytes(stages: int, rng: random.Random) -> list[StageBytes]:
    return [StageBytes(gradients=rng.uniform(0, 900), activations=rng.uniform(0, 300),
                       inputs=rng.uniform(0, 50), pending=rng.uniform(0, 40),
                       recorded=rng.uniform(0, 30), workspace=rng.uniform(0, 200),
                       received=rng.uniform(0, 60), sent=rng.uniform(0, 60),
                       reduction=rng.uniform(0, 2000) * rng.choice((0, 1)))
            for _ in range(stages)]


@pytest.mark.parametrize("name", NAMES)
def test_fast_walks_equal_the_reference(name: str) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    rng = random.Random(name)
    tried = 0
    for stages, microbatches, width, iterations in ((2, 4, 1, 1), (3, 6, 1, 2), (4, 8, 1, 1),
                                                    (2, 4, 2, 1), (4, 5, 1, 3)):
        try:
            schedule = lowered_schedule(name, Shape(stages=stages, microbatches=microbatches,
                                                    chunks=info.default_chunks, width=width,
                                                    iterations=iterations))
        except ValueError:
            continue
        tried += 1
        proofs = every_delivery_proof(schedule)
        analysis = analyse_programs(schedule)
        assert [r.holds for r in analysis] == [
            _reference_holds(schedule, rank, proofs[rank]) for rank in range(schedule.num_ranks)]
        for _ in range(4):
            recompute = [rng.random() < 0.4 for _ in range(schedule.num_stages)]
            graphless = graphless_forwards(schedule, recompute=recompute,
                                           backward=rng.choice(("recompute", "graph")))
            costs = _bytes(schedule.num_stages, rng)
            expected = [_reference_walk(r.steps, costs, graphless, timeline._in_flight(r, costs))
                        for r in analysis]
            assert peak_moments_of(analysis, costs, graphless) == expected, name
            assert any(m.total > 0 for m in expected), name
    assert tried >= 2, name
