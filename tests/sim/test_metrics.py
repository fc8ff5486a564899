"""Held activations, weight versions, and the asynchronous iteration window.

Peaks are checked against closed forms (1F1B: min(P-s, M); GPipe: M; PipeDream: P-s versions;
2BW: at most 2) and against brute-force oracles written independently of the implementation.
"""

from __future__ import annotations

import pytest

from pipeweave.ir import Layout, Op, Schedule, parse_action
from pipeweave.schedules import available_schedules, build_schedule, get_info
from pipeweave.sim import Costs, simulate
from pipeweave.sim.metrics import iteration_completions, weight_versions

CHUNKED = {"interleaved-1f1b": 2, "wpipe": 2, "gpipe-grouped": 2}


def registered() -> list[str]:
    return [info.name for info in available_schedules()]


def build(name: str, stages: int, microbatches: int, iterations: int = 1) -> Schedule:
    return build_schedule(name, stages=stages, microbatches=microbatches, iterations=iterations,
                          chunks=CHUNKED.get(name, 1))


def needs(name: str) -> None:
    if name not in registered():
        pytest.skip(f"schedule {name!r} is not registered yet")


def hand_written(rows: str, microbatches: int, iterations: int) -> Schedule:
    programs = tuple(tuple(parse_action(t) for t in line.split()[1:])
                     for line in rows.strip().splitlines())
    return Schedule(name="hand", layout=Layout.straight(len(programs)), microbatches=microbatches,
                    iterations=iterations, programs=programs, synchronous=False)


# -- activations --------------------------------------------------------------------------------
@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 1), (3, 5), (4, 8), (6, 4), (8, 3)])
def test_peak_activations_closed_forms(p: int, m: int) -> None:
    one_f_one_b = simulate(build("1f1b", p, m), Costs(activation_bytes=[10.0 * (s + 1) for s in range(p)]))
    assert one_f_one_b.peak_activations == [min(p - s, m) for s in range(p)]
    assert one_f_one_b.peak_activation_bytes == [10.0 * (s + 1) * min(p - s, m) for s in range(p)]
    assert simulate(build("gpipe", p, m)).peak_activations == [m] * p


def held_by_time(schedule: Schedule, result) -> list[float]:  # type: ignore[no-untyped-def]
    """Oracle: sweep the timeline; a forward's activation lives from its start to the end of
    its B, or of its W when the backward is split."""
    peaks = []
    for rank, program in enumerate(schedule.programs):
        ends = {(a.stage, a.microbatch, a.pipeline): result.end[rank][i]
                for i, a in enumerate(program) if a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT)}
        spans = [(result.start[rank][i], ends[(a.stage, a.microbatch, a.pipeline)],
                  0.5 if a.piece else 1.0)
                 for i, a in enumerate(program) if a.op is Op.FORWARD]
        peaks.append(max((sum(w for s, e, w in spans if s <= t < e) for t, _, _ in spans),
                         default=0.0))
    return peaks


@pytest.mark.parametrize("name", sorted(set(registered())))
def test_peak_activations_match_a_timeline_sweep(name: str) -> None:
    schedule = build(name, 4, 8, iterations=2)
    result = simulate(schedule, Costs(forward=[1.0, 1.25, 0.75, 1.0] * CHUNKED.get(name, 1), comm=0.1))
    assert result.peak_activations == held_by_time(schedule, result)


# -- weight versions ----------------------------------------------------------------------------
def versions_oracle(schedule: Schedule) -> list[int]:
    """Brute force: at every F, B and U, count the current weights, every older version that
    any action from here on names, and one transient set for a predicted (lookahead) action."""
    peak = [0] * schedule.num_stages
    for program in schedule.programs:
        current: dict[tuple[int, int], int] = {}
        for i, a in enumerate(program):
            if a.op not in (Op.FORWARD, Op.BACKWARD, Op.STEP):
                continue
            key = (a.stage, a.pipeline)
            if a.op is Op.STEP:
                current[key] = a.version if a.version is not None else current.get(key, 0) + 1
            now = current.get(key, 0)
            later = {b.version for b in program[i:] if b.op in (Op.FORWARD, Op.BACKWARD)
                     and (b.stage, b.pipeline) == key and b.version is not None and b.version < now}
            if a.op is Op.STEP:  # the outgoing version, if an action after the update names it
                later |= {b.version for b in program[i + 1:] if b.op in (Op.FORWARD, Op.BACKWARD)
                          and (b.stage, b.pipeline) == key and b.version == now - 1}
            transient = 1 if a.op is not Op.STEP and a.lookahead else 0
            peak[a.stage] = max(peak[a.stage], 1 + len(later) + transient)
    return peak


def test_hand_written_pipedream_stashes_p_minus_s_versions() -> None:
    """Two-stage PipeDream: stage 0 stashes one older version while micro-batch j+1 is in flight."""
    schedule = hand_written("""
        rank0  0F0@0 0F1@0 0B0@0 0U@1 0F2@1 0B1@0 0U@2 0F3@2 0B2@1 0U@3 0B3@2 0U@4
        rank1  1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4
    """, microbatches=2, iterations=2)
    assert weight_versions(schedule) == [2, 1]
    assert simulate(schedule).weight_versions == [2, 1]


def test_lookahead_needs_no_stash() -> None:
    """PipeOptim-style: the forward predicts one update ahead, the backward uses current weights:
    no stashed version, only the transient prediction on stage 0."""
    schedule = hand_written("""
        rank0  0F0@0 0F1@0~1 0B0@0 0U@1 0F2@1~1 0B1@1 0U@2 0F3@2~1 0B2@2 0U@3 0B3@3 0U@4
        rank1  1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4
    """, microbatches=2, iterations=2)
    assert weight_versions(schedule) == [2, 1]


@pytest.mark.parametrize("name", sorted(set(registered())))
def test_weight_versions_match_the_oracle(name: str) -> None:
    for p, m, k in [(3, 6, 3), (4, 8, 2)]:
        schedule = build(name, p, m, iterations=k)
        assert weight_versions(schedule) == versions_oracle(schedule), (name, p, m, k)


@pytest.mark.parametrize("p", [1, 2, 4, 6])
def test_pipedream_holds_p_minus_s_versions(p: int) -> None:
    needs("pipedream")
    assert simulate(build("pipedream", p, 2 * p, iterations=3)).weight_versions == \
        [p - s for s in range(p)]


@pytest.mark.parametrize("p", [1, 2, 4, 6])
def test_2bw_holds_at_most_two_versions(p: int) -> None:
    needs("2bw")
    versions = simulate(build("2bw", p, 2 * p, iterations=3)).weight_versions
    assert max(versions) <= 2
    if p > 1:
        assert versions[0] == 2  # the first stage does hold two


def test_synchronous_schedules_hold_one_version() -> None:
    for name in ("gpipe", "1f1b"):
        assert simulate(build(name, 4, 8, iterations=3)).weight_versions == [1] * 4


# -- asynchronous steady state --------------------------------------------------------------------
def async_names() -> list[str]:
    return sorted(info.name for info in available_schedules() if not info.synchronous)


@pytest.mark.parametrize("name", async_names() or ["pipedream"])
def test_asynchronous_steady_state_has_no_bubble(name: str) -> None:
    needs(name)
    p, m, k = 4, 8, 4
    schedule = build(name, p, m, iterations=k)
    result = simulate(schedule)
    c = iteration_completions(schedule, result.end)
    assert result.window == (c[0], c[k - 2])
    assert result.iteration_time == pytest.approx((c[k - 2] - c[0]) / (k - 2))
    assert result.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    # every rank is busy all the time: one iteration is all of its forwards and backwards
    chunks = CHUNKED.get(name, 1)
    assert result.iteration_time == pytest.approx(m * chunks * (1.0 + 2.0))


def test_async_window_with_two_and_one_iterations() -> None:
    needs("pipedream")
    two = simulate(build("pipedream", 3, 6, iterations=2))
    c = iteration_completions(two.schedule, two.end)
    assert two.window == (c[0], c[1]) and two.iteration_time == c[1] - c[0]
    one = simulate(build("pipedream", 3, 6, iterations=1))
    assert one.window == (0.0, one.makespan) and one.iteration_time == one.makespan


def test_info_flags_match_schedules() -> None:
    for name in registered():
        assert build(name, 2, 4).synchronous == get_info(name).synchronous
