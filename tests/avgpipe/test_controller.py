"""Algorithm 1 (advance forward propagation): the state machine, and driven by the simulator."""

from __future__ import annotations

import pytest

from pipeweave.avgpipe import AdvanceController, run_controller
from pipeweave.avgpipe.simulated import advance_probe
from pipeweave.sim import Costs


def feed(controller: AdvanceController, times: dict[int, float], peaks: dict[int, float],
         iterations: int = 20) -> list[int]:
    used = []
    for _ in range(iterations):
        used.append(controller.advance)
        controller.next_advance(times[controller.advance], peaks[controller.advance])
    return used


def test_raises_while_faster_then_steps_back_from_a_slower_iteration() -> None:
    times = {0: 10.0, 1: 9.0, 2: 8.5, 3: 8.7, 4: 8.8}
    peaks = {a: 100.0 + 10 * a for a in times}
    c = AdvanceController(1e9, 4, patience=0)
    used = feed(c, times, peaks, 6)
    assert used == [0, 1, 2, 3, 2, 2]           # 3 was slower: back to 2, settled
    assert c.settled and c.advance == 2 == c.best_advance
    assert [s.decision for s in c.history[:4]] == ["raise", "raise", "raise", "settle"]
    assert c.history[3].reason == "not faster"


def test_patience_crosses_a_plateau() -> None:
    times = {0: 10.0, 1: 10.0, 2: 9.0, 3: 9.0, 4: 9.0}
    peaks = {a: float(a) for a in times}
    literal = AdvanceController(1e9, 4, patience=0)
    feed(literal, times, peaks)
    assert literal.advance == 0                 # the paper's rule stops on the plateau
    patient = AdvanceController(1e9, 4, patience=1)
    feed(patient, times, peaks)
    assert patient.advance == 2                 # smallest advance with the best time
    assert [s.decision for s in patient.history[:5]] == ["raise", "probe", "raise", "probe",
                                                        "settle"]


def test_memory_limit_is_predicted_from_the_growth_per_advance() -> None:
    times = {a: 10.0 - a for a in range(8)}
    peaks = {a: 100.0 + 10 * a for a in range(8)}     # +10 bytes per advance
    c = AdvanceController(125.0, 7)
    feed(c, times, peaks)
    # at 2 (120 B) the next step would need 130 > 125: stop there, never exceed the limit
    assert c.advance == 2 and max(s.peak_memory for s in c.history) <= 125.0
    assert c.history[2].decision == "settle"
    assert c.history[2].reason == "advance 3 would exceed 125 B"
    # with step_bytes known up front it stops even before the first raise
    early = AdvanceController(105.0, 7, step_bytes=10.0)
    feed(early, times, peaks)
    assert early.advance == 0 and early.history[0].decision == "settle"


def test_an_observed_excess_steps_back() -> None:
    times = {0: 10.0, 1: 9.0, 2: 8.0}
    peaks = {0: 100.0, 1: 200.0, 2: 300.0}
    c = AdvanceController(150.0, 2)             # growth unknown until the first raise
    feed(c, times, peaks)
    assert c.advance == 0 and "over the limit" in c.history[1].reason


def test_reaches_afab_and_samples_take_the_median() -> None:
    times = {0: 10.0, 1: 9.0, 2: 8.0}
    c = AdvanceController(1e9, 2, samples=3)
    sequence = [10.0, 30.0, 10.0, 9.0, 9.0, 1.0, 8.0, 8.0, 8.0]   # one outlier per step
    for t in sequence:
        c.next_advance(t, 1.0)
    assert c.advance == 2 and c.settled and c.history[-1].reason == "reached AFAB (max_advance)"


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="limit_bytes must be > 0"):
        AdvanceController(0, 3)
    with pytest.raises(ValueError, match="max_advance must be an integer >= 0"):
        AdvanceController(1e9, -1)
    with pytest.raises(ValueError, match="iteration_time must be > 0"):
        AdvanceController(1e9, 3).next_advance(0.0, 1.0)


# -- driven by the simulator: Algorithm 1 against injected communication delay ----------------

def trajectory(stages: int, microbatches: int, comm: float, limit: float) -> dict[str, object]:
    probe = advance_probe(stages, microbatches, Costs.uniform(1.0, 2.0, comm))
    controller = AdvanceController(limit, microbatches - 1)
    history = run_controller(controller, probe, 40)
    steps = [(s.advance, s.iteration_time, max(probe(s.advance)[1])) for s in history]
    one_f_one_b, afab = probe(0), probe(microbatches - 1)
    chosen = probe(controller.advance)
    print(f"\nP={stages} M={microbatches} comm={comm} limit={limit:g}: "
          f"(advance, iteration time, peak activations) {steps} -> advance {controller.advance}: "
          f"time {chosen[0]:g} (1F1B {one_f_one_b[0]:g}, AFAB {afab[0]:g}), peak {max(chosen[1]):g} "
          f"(1F1B {max(one_f_one_b[1]):g}, AFAB {max(afab[1]):g})")
    return {"advance": controller.advance, "time": chosen[0], "peak": max(chosen[1]),
            "1f1b": one_f_one_b[0], "afab": afab[0], "afab_peak": max(afab[1]),
            "times": [t for _, t, _ in steps]}


@pytest.mark.parametrize("stages,microbatches", [(2, 8), (4, 8), (4, 16)])
def test_without_delay_it_stays_at_1f1b(stages: int, microbatches: int) -> None:
    out = trajectory(stages, microbatches, 0.0, 1e9)
    assert out["advance"] == 0 and out["time"] == out["1f1b"] == out["afab"]


@pytest.mark.parametrize("stages,microbatches", [(2, 8), (4, 8), (4, 16)])
def test_with_delay_it_raises_towards_afab_under_the_memory_limit(stages: int,
                                                                   microbatches: int) -> None:
    # a limit halfway between 1F1B's and AFAB's peak activations (1 unit = one micro-batch)
    limit = (stages + microbatches) / 2
    out = trajectory(stages, microbatches, 1.0, limit)
    assert out["advance"] > 0
    assert out["afab"] < out["time"] < out["1f1b"]            # faster, towards AFAB
    assert out["peak"] <= limit < out["afab_peak"]            # below AFAB's memory
    times = out["times"]
    assert all(b <= a for a, b in zip(times, times[1:]))      # never got slower on the way


def test_with_delay_and_no_limit_it_reaches_afabs_time() -> None:
    out = trajectory(4, 8, 1.0, 1e9)
    assert out["time"] == out["afab"] == 39.0 and out["1f1b"] == 49.0
    assert out["advance"] == 6   # the smallest advance with AFAB's time (7 is AFAB itself)


@pytest.mark.parametrize("stop", range(1, 15))
def test_a_saved_state_continues_with_the_same_decisions(stop: int) -> None:
    """state_dict, through JSON (as a checkpoint's manifest holds it), into a fresh controller:
    fed the same numbers, it takes the same decisions as the controller never stopped —
    wherever it stopped (sampling, climbing, probing, settled)."""
    import json

    times = {0: 10.0, 1: 9.0, 2: 9.1, 3: 8.0, 4: 8.5, 5: 8.4}
    peaks = {a: 100.0 + 10 * a for a in times}
    settings = {"patience": 1, "samples": 2, "tolerance": 0.01}
    straight = AdvanceController(1e9, 5, **settings)
    used = feed(straight, times, peaks, 16)
    stopped = AdvanceController(1e9, 5, **settings)
    first = feed(stopped, times, peaks, stop)
    resumed = AdvanceController(1e9, 5, **settings)
    resumed.load_state_dict(json.loads(json.dumps(stopped.state_dict())))
    assert first + feed(resumed, times, peaks, 16 - stop) == used
    assert resumed.history == straight.history and resumed.settled == straight.settled
    assert used[-1] == 3 and straight.settled
    with pytest.raises(ValueError, match=r"other settings .*'samples': \(2, 1\)"):
        AdvanceController(1e9, 5, patience=1, tolerance=0.01).load_state_dict(
            stopped.state_dict())
