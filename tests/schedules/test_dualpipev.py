"""dualpipev: the literal order for P=2 and P=4, torch's order, pairs, bubble and memory.

Programs are written per rank as the module docstring shows them: the compute passes in
program order, versions left out. Memory is counted from the programs (:func:`held`), the
bubble is timed by the simulator.
"""

from __future__ import annotations

import itertools

import pytest

from pipeweave.ir import Layout, Op, Schedule, lower, validate
from pipeweave.schedules import Shape, build_schedule, get_info
from pipeweave.sim import Costs, simulate
from unit_timeline import held


def build(stages: int, microbatches: int, **kw: object) -> Schedule:
    return build_schedule("dualpipev", stages=stages, microbatches=microbatches, chunks=2, **kw)


def passes(schedule: Schedule) -> list[str]:
    return [" ".join(str(a.with_(version=None)) for a in program if a.is_compute)
            for program in schedule.programs]


def test_literal_two_ranks() -> None:
    # rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; pairs [F B] as in the docstring
    assert passes(build(2, 4)) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3",
    ]


def test_literal_four_ranks() -> None:
    # phases (docstring): fill chunk 0, F0 F1, I1 W F1, [F0 B1] [F1 B0], B1 [F1 B0], B1 B0
    # split from the middle on, W I0, the W's owed
    assert passes(build(4, 8)) == [
        "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 0F7 7B3 7F4 0B0 "
        "7B4 7F5 0B1 7B5 7F6 0B2 7B6 7F7 0B3 7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7",
        "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 1F6 6B2 6F4 1B0 1F7 6B3 6F5 "
        "1B1 6B4 6F6 1B2 6B5 6F7 1B3 6B6 1B4 6I7 1I5 6W7 1I6 1W5 1I7 1W6 1W7",
        "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 2F5 5B1 5F4 2B0 2F6 5B2 5F5 2B1 2F7 5B3 "
        "5F6 2B2 5B4 5F7 2B3 5B5 2B4 5B6 2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7",
        "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 4F4 3B0 3F5 4B1 4F5 3B1 3F6 4B2 4F6 3B2 3F7 "
        "4B3 4F7 3B3 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7",
    ]


def torch_order(P: int, M: int) -> list[str]:
    """torch's own ScheduleDualPipeV order (an independent implementation), overlapped
    pairs flattened into their forward then their backward, as torch's runtime runs them."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, "ScheduleDualPipeV", None)
    if cls is None:
        pytest.skip("this torch has no ScheduleDualPipeV")
    schedule = cls.__new__(cls)  # only the order generator, no process group
    schedule.pp_group_size, schedule._n_microbatches = P, M
    rows = []
    for rank in range(P):
        flat = []
        for action in schedule._calculate_single_rank_operations(rank):
            for sub in (action.sub_actions or (action,)):
                flat.append(str(sub))
        rows.append(" ".join(flat))
    return rows


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6])
def test_same_order_as_torch(stages: int) -> None:
    for microbatches in range(2 * stages, 4 * stages + 2):
        assert passes(build(stages, microbatches)) == torch_order(stages, microbatches), (
            stages, microbatches)


def test_forwards_are_paired_with_another_microbatchs_backward() -> None:
    # rank r pairs 2(M - 2P + r + 1) forwards in phase 4 and P - 1 - r in phase 5, each F
    # directly followed by the B of the other chunk on an older micro-batch
    P, M = 4, 11
    schedule = build(P, M)
    for r, program in enumerate(schedule.programs):
        compute = [a for a in program if a.is_compute]
        pairs = [(f, b) for f, b in zip(compute, compute[1:])
                 if f.op is Op.FORWARD and b.op is Op.BACKWARD]
        assert len(pairs) == 2 * (M - 2 * P + r + 1) + (P - 1 - r), r
        assert all(f.stage != b.stage and f.microbatch > b.microbatch for f, b in pairs)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6, 7])
def test_memory_is_2p_plus_1_chunk_activations_on_every_rank(stages: int) -> None:
    # the report's PP + 1 with PP = 2P stages; the simulator counts the same on the lowered
    # schedule (where an I next to its W runs as one B)
    for microbatches in (2 * stages, 2 * stages + 1, 3 * stages, 5 * stages):
        schedule = build(stages, microbatches)
        assert [held(p) for p in schedule.programs] == [2 * stages + 1] * stages
        assert simulate(lower(schedule)).peak_activations == [2 * stages + 1] * stages


def idle(f: float, i: float, w: float) -> float:
    """Idle time per rank per unit of P - 1 (module docstring), for W <= I <= F."""
    return max(f + i - w, 2 * (f - w))


COSTS = [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5), (2.0, 2.0, 1.0), (1.0, 0.5, 0.25),
         (3.0, 1.0, 1.0), (3.0, 2.0, 0.5), (1.5, 0.5, 0.5)]


@pytest.mark.parametrize(("f", "i", "w"), COSTS)
def test_every_rank_idles_p_minus_1_times_the_closed_form(f: float, i: float, w: float) -> None:
    for stages, microbatches in itertools.product(range(1, 6), range(2, 21)):
        if microbatches < 2 * stages:
            continue
        result = simulate(build(stages, microbatches), Costs(forward=f, backward=i + w, weight_grad=w))
        expected = (stages - 1) * idle(f, i, w)
        assert [result.makespan - busy for busy in result.busy] == pytest.approx(
            [expected] * stages), (stages, microbatches)
        assert result.makespan == pytest.approx(2 * microbatches * (f + i + w) + expected)


def test_unit_costs_against_1f1b_and_zbv() -> None:
    # P=4, M=8, F = I = W = 1 per chunk (B = 2): 6M + P - 1 = 51; ZB-V the same; 1F1B on the
    # same model (a stage is two chunks: F = 2, B = 4) 6(M + P - 1) = 66
    costs = Costs(forward=1, backward=2)
    assert simulate(build(4, 8), costs).makespan == 51
    assert simulate(build_schedule("zbv", stages=4, microbatches=8, chunks=2), costs).makespan == 51
    assert simulate(build_schedule("1f1b", stages=4, microbatches=8),
                    Costs(forward=2, backward=4)).makespan == 66


def test_registry_layout_and_lowering() -> None:
    info = get_info("dualpipev")
    assert info.placement == "v" and info.default_chunks == 2 and info.synchronous
    schedule = build(3, 6, iterations=2)
    assert schedule.layout == Layout.v_shape(3)
    validate(schedule)
    lowered = lower(schedule)
    validate(lowered)
    # the bottom of the V sends nothing; iteration 1 repeats iteration 0 shifted by M
    sent = {(a.op, a.stage) for _, _, a in lowered.actions() if a.is_comm}
    assert (Op.SEND_ACT, 2) not in sent and (Op.SEND_GRAD, 3) not in sent
    for program in schedule.programs:
        first = [a for a in program if a.is_compute and a.version == 0]
        second = [a for a in program if a.is_compute and a.version == 1]
        assert [a.with_(microbatch=a.microbatch + 6, version=1) for a in first] == second
        assert [a.version for a in program if a.op is Op.STEP] == [1, 1, 2, 2]


def test_width_copies_the_v() -> None:
    schedule = build(2, 8, width=2)
    assert schedule.layout == Layout.v_shape(2, width=2)
    validate(lower(schedule))
    alone = build(2, 4)
    copy1 = [a for a in schedule.programs[3] if a.is_compute]
    assert [str(a.with_(microbatch=a.microbatch // 2)) for a in copy1] == [
        str(a) for a in alone.programs[1] if a.is_compute]


def test_refusals_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"microbatches >= 6 .* got 5; raise --microbatches to at least 6"):
        build(3, 5)
    with pytest.raises(ValueError, match=r"microbatches >= 8 .* raise --microbatches"):
        build(2, 6, width=2)
    with pytest.raises(ValueError, match=r"exactly two chunks .* got chunks=3; use chunks=2"):
        build_schedule("dualpipev", stages=2, microbatches=4, chunks=3)
    with pytest.raises(ValueError, match=r"replicas"):
        get_info("dualpipev").generate(Shape(stages=2, microbatches=4, chunks=2, replicas=(1, 2)))


def test_one_chunk_is_plain_1f1b() -> None:
    schedule = build_schedule("dualpipev", stages=3, microbatches=5, iterations=2)
    reference = build_schedule("1f1b", stages=3, microbatches=5, iterations=2)
    assert schedule.programs == reference.programs and schedule.name == "dualpipev"
