"""Critical path and master stage (AutoPipe §III-B, Fig. 4 and Fig. 7)."""

from __future__ import annotations

import pytest

from pipeweave.ir import Op, Schedule
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, SimulationResult, simulate


def build(name: str, stages: int, microbatches: int, iterations: int = 1) -> Schedule:
    return build_schedule(name, stages=stages, microbatches=microbatches, iterations=iterations)


def path_texts(result: SimulationResult) -> list[str]:
    return [str(a) for a in result.critical_path]


def test_balanced_1f1b_path_runs_along_the_last_stage() -> None:
    """P=3, M=4: up the forwards of micro-batch 0, the last stage's 1F1B, down the last backward.

        stage0  F0 F1 F2 .  .  .  B0 F3 .  B1 .  B2 .  B3
        stage1  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3
        stage2  .  .  F0 B0 F1 B1 F2 B2 F3 B3          <- path (master stage 2)
    """
    result = simulate(build("1f1b", 3, 4))
    assert path_texts(result) == [
        "0F0@0", "1F0@0", "2F0@0", "2B0@0", "2F1@0", "2B1@0", "2F2@0", "2B2@0", "2F3@0", "2B3@0",
        "1B3@0", "0B3@0",
    ]
    assert result.master_stage == 2


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (5, 3), (8, 12)])
def test_1f1b_path_starts_and_ends_on_stage_0(p: int, m: int) -> None:
    result = simulate(build("1f1b", p, m), Costs(comm=0.25))
    texts = path_texts(result)
    assert texts[0] == "0F0@0"
    assert texts[-1] == f"0B{m - 1}@0"


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("comm", [0.0, 0.5])
def test_path_is_a_chain_of_tight_edges_as_long_as_the_makespan(name: str, comm: float) -> None:
    result = simulate(build(name, 4, 6, iterations=2),
                      Costs(forward=[1, 2, 1.5, 1], backward=[2, 3, 2, 2.5], comm=comm))
    locations = result.critical_path_locations
    assert result.start[locations[0][0]][locations[0][1]] == 0.0
    assert result.end[locations[-1][0]][locations[-1][1]] == result.makespan
    for (r0, p0), (r1, p1) in zip(locations, locations[1:]):
        gap = result.start[r1][p1] - result.end[r0][p0]
        assert gap == pytest.approx(comm if r0 != r1 else 0.0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("heavy", [0, 1, 2, 3])
def test_master_stage_is_the_heaviest_stage(name: str, heavy: int) -> None:
    forward = [2.0 if s == heavy else 1.0 for s in range(4)]
    backward = [4.0 if s == heavy else 2.0 for s in range(4)]
    result = simulate(build(name, 4, 8), Costs(forward=forward, backward=backward))
    assert result.master_stage == heavy
    # the path follows the heavy stage through its steady phase: all of its backwards
    on_heavy = {a.microbatch for a in result.critical_path if a.stage == heavy and a.op is Op.BACKWARD}
    assert on_heavy == set(range(8))


def test_balanced_gpipe_master_is_the_last_stage() -> None:
    assert simulate(build("gpipe", 5, 7)).master_stage == 4


def test_moving_load_forward_moves_the_master_stage_and_shortens_the_iteration() -> None:
    """AutoPipe Fig. 7(a)->(b): swapping the loads of stages 1 and 2 moves the master stage
    from 2 to 1 and shortens the iteration."""
    before = simulate(build("1f1b", 4, 8), Costs(forward=[1, 1, 1.5, 1], backward=[2, 2, 3, 2]))
    after = simulate(build("1f1b", 4, 8), Costs(forward=[1, 1.5, 1, 1], backward=[2, 3, 2, 2]))
    assert (before.master_stage, after.master_stage) == (2, 1)
    assert after.iteration_time < before.iteration_time
