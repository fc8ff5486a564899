"""A plan as Megatron-Core's layout string and torchtitan's config: literal outputs, and the
refusals for what those systems cannot express."""

from __future__ import annotations

import pytest

from pipeweave.planner import Plan
from pipeweave.planner.interchange import NotExpressible, megatron_layout, torchtitan_config

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

WHOLE = ["embed", *(f"layer{i}" for i in range(6)), "head"]
HALVES = ["embed", *(f"layer{i}.{h}" for i in range(3) for h in ("attn", "ffn")), "head"]


def test_megatron_layout_of_whole_layers() -> None:
    plan = Plan(num_blocks=8, stages=((0, 3), (3, 6), (6, 8)))
    assert megatron_layout(plan, WHOLE) == "Et*2|t*3|tL"


def test_megatron_layout_of_sub_layer_blocks_cut_at_layer_boundaries() -> None:
    plan = Plan(num_blocks=8, stages=((0, 3), (3, 8)))  # embed, layer0 | layer1, layer2, head
    assert megatron_layout(plan, HALVES) == "Et|t*2L"


def test_interleaved_stages_are_listed_in_pipeline_order() -> None:
    plan = Plan(num_blocks=8, stages=((0, 2), (2, 4), (4, 6), (6, 8)), chunks=2,
                schedule="interleaved-1f1b")
    assert megatron_layout(plan, WHOLE) == "Et|t*2|t*2|tL"


def test_a_cut_inside_a_layer_is_refused_with_the_boundary() -> None:
    plan = Plan(num_blocks=8, stages=((0, 2), (2, 8)))  # embed, layer0.attn | layer0.ffn ...
    with pytest.raises(NotExpressible, match=r"block 2 \(layer0.ffn\) cuts layer 0"):
        megatron_layout(plan, HALVES)


def test_torchtitan_config() -> None:
    plan = Plan(num_blocks=8, stages=((0, 3), (3, 6), (6, 8)), schedule="1f1b", microbatches=8,
                width=2, recompute=(True, True, True))
    config = tomllib.loads(torchtitan_config(plan, WHOLE, batch_size=32))
    assert config == {
        "parallelism": {"pipeline_parallel_degree": 3, "pipeline_parallel_schedule": "1F1B",
                        "pipeline_parallel_microbatch_size": 4,
                        "pipeline_parallel_split_points": ["layers.2", "layers.5"],
                        "data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1},
        "activation_checkpoint": {"mode": "full"}}


@pytest.mark.parametrize("plan,match", [
    (Plan(num_blocks=8, stages=((0, 4), (4, 8)), schedule="pipedream"), "no torch"),
    (Plan(num_blocks=8, stages=((0, 7), (7, 8))), "holds no transformer layer"),
    (Plan(num_blocks=8, stages=((0, 4), (4, 8)), recompute=(True, False)), "some stages only"),
])
def test_torchtitan_refusals(plan: Plan, match: str) -> None:
    with pytest.raises(NotExpressible, match=match):
        torchtitan_config(plan, WHOLE, batch_size=8)


def test_models_that_are_not_transformers_are_refused() -> None:
    plan = Plan(num_blocks=5, stages=((0, 2), (2, 5)))
    with pytest.raises(NotExpressible, match="'conv2' is not an embedding"):
        megatron_layout(plan, ["conv0", "conv1", "conv2", "fc", "head"])
