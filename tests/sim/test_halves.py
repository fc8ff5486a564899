"""Half costs of AutoPipe's Slicer (sim/halves.py): given, a half costs them in the walk, the
compiled walk and the shared-cores walk; not given, everything is as before."""

from __future__ import annotations

import pytest

from pipeweave.ir import Schedule
from pipeweave.ir.walk import index_actions
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate
from pipeweave.sim.compiled import compile_schedule

HALVES = {"half_forward": [1.5, 2.5], "half_backward": [3.0, 4.0]}
WHOLE = {"forward": [2.0, 4.0], "backward": [4.0, 6.0], "comm": 1.0, "latency": 0.5}

# 2-stage sliced 1F1B, M = 2, micro-batch 0 forwarded in halves. F = (2, 4), B = (4, 6),
# halves F = (1.5, 2.5), one half's B = (3, 4) (its micro-batch's B runs two: 6, 8); a message
# costs latency 0.5 + transfer 1 (a half's: 0.5 + 0.5). By hand:
#   rank 0: 0F0a 0-1.5, 0F0b 1.5-3, 0F1 3-5
#   rank 1: 1F0a starts 1.5 + 1 = 2.5, ends 5; 1F0b 5-7.5 (its input came at 3 + 1 = 4)
#           1B0 7.5-15.5 (2 x 4); 1F1 15.5-19.5 (input at 5 + 1.5); 1B1 19.5-25.5
#   rank 0: 0B0 starts 15.5 + 1.5 = 17, ends 23 (2 x 3); 0B1 starts 25.5 + 1.5 = 27, ends 31
BY_HAND = {"0F0a": (0.0, 1.5), "0F0b": (1.5, 3.0), "0F1": (3.0, 5.0), "1F0a": (2.5, 5.0),
           "1F0b": (5.0, 7.5), "1B0": (7.5, 15.5), "1F1": (15.5, 19.5), "1B1": (19.5, 25.5),
           "0B0": (17.0, 23.0), "0B1": (27.0, 31.0)}


def _sliced(stages: int = 2, microbatches: int = 2, sliced: int = 1,
            iterations: int = 1) -> Schedule:
    return build_schedule("sliced-1f1b", stages=stages, microbatches=microbatches,
                          sliced=sliced, iterations=iterations)


def test_given_halves_give_the_hand_computed_timeline() -> None:
    result = simulate(_sliced(), Costs(**WHOLE, **HALVES))
    times = {text.split("@")[0]: (t0, t1) for _, text, t0, t1 in result.timeline
             if "U" not in text}
    assert times == BY_HAND
    assert result.makespan == 31.0


def test_the_compiled_walk_prices_halves_the_same() -> None:
    schedule = _sliced()
    table = Costs(**WHOLE, **HALVES).resolve(schedule.num_stages)
    compiled = compile_schedule(schedule, index_actions(schedule), min_width=1)
    assert compiled is not None
    start, end = compiled.times(table)
    by_text = {str(a).split("@")[0]: (s, e) for a, s, e in
               zip((a for p in schedule.programs for a in p), start.tolist(), end.tolist())}
    assert {k: by_text[k] for k in BY_HAND} == BY_HAND


def test_shared_cores_walk_prices_halves() -> None:
    """One core for two ranks: the busy work adds up to at least every priced action."""
    schedule = _sliced()
    result = simulate(schedule, Costs(**WHOLE, **HALVES, shared_cores=1))
    work = sum(e - s for text in BY_HAND for s, e in [BY_HAND[text]])
    assert result.makespan >= work  # 1.5+1.5+2+2.5+2.5+8+4+6+6+4 = 38 on one core
    plain = simulate(schedule, Costs(**WHOLE, shared_cores=1))
    assert plain.makespan < result.makespan


@pytest.mark.parametrize("stages,microbatches,sliced,iterations",
                         [(2, 2, 1, 1), (4, 8, 2, 2), (3, 5, 3, 1)])
def test_halves_at_half_the_whole_change_nothing(stages: int, microbatches: int, sliced: int,
                                                 iterations: int) -> None:
    schedule = _sliced(stages, microbatches, sliced, iterations)
    forward = [1.0 + 0.7 * s for s in range(stages)]
    backward = [2.3 + 0.4 * s for s in range(stages)]
    plain = Costs(forward=forward, backward=backward, comm=0.3, latency=0.1)
    halved = Costs(forward=forward, backward=backward, comm=0.3, latency=0.1,
                   half_forward=[f / 2 for f in forward], half_backward=[b / 2 for b in backward])
    old, new = simulate(schedule, plain), simulate(schedule, halved)
    assert new.timeline == old.timeline
    assert new.iteration_time == old.iteration_time
    assert plain.resolve(stages).half_forward == ()  # none given: nothing filled


def test_halves_cost_more_than_half_slow_a_sliced_plan() -> None:
    schedule = _sliced(4, 8, 2)
    plain = simulate(schedule, Costs(forward=1.0, backward=2.0))
    dearer = simulate(schedule, Costs(forward=1.0, backward=2.0, half_forward=0.9,
                                      half_backward=1.5))
    # every sliced micro-batch: 2 x 0.9 forward, 2 x 1.5 backward, on every stage
    assert dearer.iteration_time > plain.iteration_time
    assert sum(dearer.busy) == pytest.approx(sum(plain.busy) + 4 * 2 * (0.8 + 1.0))


def test_json_round_trip_and_defaults() -> None:
    costs = Costs(**WHOLE, **HALVES, half_weight_grad=[1.0, 2.0])
    data = costs.to_json()
    assert data["half_forward"] == [1.5, 2.5] and data["half_weight_grad"] == [1.0, 2.0]
    assert Costs(**data).resolve(2) == costs.resolve(2)
    assert Costs().to_json()["half_forward"] is None
    table = Costs(backward=[4.0, 6.0], weight_grad=[1.0, 3.0], half_backward=[3.0, 4.0]).resolve(2)
    assert table.half_forward == (0.5, 0.5)  # half the default forward
    assert table.half_weight_grad == (0.75, 2.0)  # the whole's proportion W / B
    assert table.half_input_grad == (2.25, 2.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"half_forward": -1.0}, "half_forward must be a finite number >= 0"),
    ({"half_weight_grad": 1.0}, "half_weight_grad=1.0 needs half_backward"),
    ({"half_backward": 1.0, "half_weight_grad": 2.0}, "half_weight_grad 2 exceeds half_backward 1"),
    ({"half_forward": [1.0, 2.0, 3.0]}, "half_forward has 3 values"),
])
def test_bad_halves_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Costs(**kwargs).resolve(2)
