"""ModelSpec.tied: parameters several blocks share; a plan may split them over stages where
the schedule keeps the copies exact (runtime/execution/ties.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeweave.models import ModelSpec
from pipeweave.runtime import Plan
from pipeweave.runtime.execution.parts import check_model_fits_plan, make_schedule
from pipeweave.runtime.execution.ties import split_ties


def _tied_spec() -> ModelSpec:
    """Embedding and output projection sharing one weight, with two layers between."""
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    return ModelSpec.from_blocks([embed, nn.Linear(4, 4), nn.Linear(4, 4), head],
                                 nn.functional.cross_entropy, name="tied")


def test_shared_parameters_are_found_by_global_name() -> None:
    spec = _tied_spec()
    assert spec.tied == (("0.weight", "3.weight"),)
    assert spec.tied_blocks() == ((0, 3),)
    untied = ModelSpec.from_blocks([nn.Linear(2, 2), nn.Linear(2, 2)], nn.functional.mse_loss)
    assert untied.tied == ()


def test_sharing_inside_one_block_is_no_tie() -> None:
    block = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    block[1].weight = block[0].weight
    assert ModelSpec.from_blocks([block, nn.Linear(3, 3)], nn.functional.mse_loss).tied == ()


def test_a_plan_keeping_the_tie_in_one_stage_is_accepted() -> None:
    check_model_fits_plan(_tied_spec(), Plan.uniform(4, 1))


@pytest.mark.parametrize("plan", [Plan.uniform(4, 2), Plan.uniform(4, 4),
                                  Plan.uniform(4, 2, chunks=2, schedule="interleaved-1f1b")])
def test_a_synchronous_plan_splitting_the_tie_keeps_it(plan: Plan) -> None:
    check_model_fits_plan(_tied_spec(), plan)
    ties = split_ties(_tied_spec(), plan, make_schedule(plan, 2))
    assert [(t.names, t.stages[0], t.stages[-1]) for t in ties] == [
        (("0.weight", "3.weight"), 0, len(plan.stages) - 1)]


def test_a_stale_schedule_splitting_the_tie_is_refused() -> None:
    plan = Plan.uniform(4, 2, schedule="pipedream")
    with pytest.raises(ValueError, match=r"model 'tied' ties 0.weight and 3.weight .* blocks "
                                         r"0 \(0\), 3 \(3\) on stages 0, 1; schedule 'pipedream'.*"
                                         r"tie_word_embeddings=False"):
        split_ties(_tied_spec(), plan, make_schedule(plan, 2))


def test_deep_copying_one_stage_keeps_the_tie() -> None:
    """Why one stage is safe: a stage deep-copies its blocks in one call."""
    import copy

    spec = _tied_spec()
    stage = nn.Sequential(*copy.deepcopy(list(spec.blocks)))
    assert stage[0].weight is stage[3].weight
    assert torch.equal(stage[0].weight, spec.blocks[0].weight)
