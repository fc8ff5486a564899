import json

import pytest

from pipeweave.runtime import Plan


def test_uniform_split_covers_blocks() -> None:
    plan = Plan.uniform(10, 3)
    assert plan.stages == ((0, 4), (4, 7), (7, 10))
    assert plan.world_size == 3


def test_json_round_trip(tmp_path) -> None:
    plan = Plan.uniform(8, 2, chunks=2, schedule="interleaved-1f1b", microbatches=4,
                        recompute=(True, False, False, True), schedule_options={"x": 1})
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    assert json.loads(path.read_text())["stages"] == [[0, 2], [2, 4], [4, 6], [6, 8]]


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (((0, 3), (2, 6)), "overlaps the previous stage"),
        (((0, 3), (4, 6)), "leaves a gap"),
        (((0, 3), (3, 5)), "the last stage must end at 6"),
        (((0, 3), (3, 3), (3, 6)), "is empty"),
    ],
)
def test_bad_cover_is_rejected(stages, message) -> None:
    with pytest.raises(ValueError, match=message):
        Plan(num_blocks=6, stages=stages)


def test_replicas_and_width() -> None:
    assert Plan.uniform(6, 2, replicas=(2, 1)).world_size == 3
    assert Plan.uniform(6, 2, width=2).world_size == 4
    with pytest.raises(ValueError, match="one entry per stage"):
        Plan.uniform(6, 2, replicas=(2,))


def test_unknown_fields_rejected() -> None:
    with pytest.raises(ValueError, match="unknown fields"):
        Plan.from_json({"num_blocks": 2, "stages": [[0, 2]], "stagez": 1})


def test_a_v_schedule_plan_places_its_chunks_in_a_v() -> None:
    """Plan.layout follows the schedule's placement (the memory estimate reads it)."""
    assert Plan.uniform(8, 2, chunks=2, schedule="zbv", microbatches=4).layout().stage_ranks == (
        (0,), (1,), (1,), (0,))
    assert Plan.uniform(8, 2, chunks=2, schedule="interleaved-1f1b",
                        microbatches=4).layout().stage_ranks == ((0,), (1,), (0,), (1,))
