"""Recomputation per stage: the first k stages recompute, priced per stage, chosen to fit.

The oracle of the memory test is the planner's memory model asked about hand-made plans (the
search's choice must be the prefix a person would pick from those numbers); the costs are
checked against sums of the profile's blocks written out here.
"""

from __future__ import annotations

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, search
from pipeweave.auto.axes import recompute_counts
from pipeweave.auto.predict import candidate_costs, candidate_plan
from pipeweave.auto.problem import Candidate
from pipeweave.cli.cmd_auto import format_table, prediction_json
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.plan import Plan
from pipeweave.profiler import BlockProfile, Profile


def _even_profile(blocks: int = 4) -> Profile:
    """Identical blocks whose activations dwarf their parameters: memory is activations."""
    return Profile(tuple(BlockProfile(f"b{i}", forward=1e-3, backward=2e-3, output_bytes=1e5,
                                      activation_bytes=4e6, parameter_bytes=1e4)
                         for i in range(blocks)),
                   model="even", batch_size=1, device="synthetic", source="synthetic")


def _peak(profile: Profile, recompute: tuple[bool, ...], batch: int) -> float:
    plan = Plan(num_blocks=4, stages=((0, 1), (1, 2), (2, 3), (3, 4)), schedule="1f1b",
                microbatches=8, recompute=recompute)
    return max(r.total for r in predicted_memory(profile, plan, batch_size=batch))


def test_a_limit_that_needs_stage_0_recomputed_gets_exactly_that() -> None:
    profile = _even_profile()
    batch = 8
    none = _peak(profile, (False,) * 4, batch)
    first = _peak(profile, (True, False, False, False), batch)
    assert first < none  # 1F1B: stage 0 holds 4 micro-batches, stage 1 only 3
    problem = AutoProblem(profile=profile, ranks=4, batch_size=batch, schedules=("1f1b",),
                          methods=("uniform",), microbatches=(8,), depths=(4,),
                          memory_limit=(first + none) / 2)
    result = search(problem)
    assert result.winner.plan.recompute == (True, False, False, False)
    assert result.winner.candidate.recompute_label(4) == "1/4"
    assert result.winner.max_memory == pytest.approx(first)
    table = format_table(result, 10)
    assert "1/4" in table.splitlines()[2]
    data = prediction_json(result.winner)
    assert data["recompute"] == 1
    assert data["recompute_per_stage"] == [True, False, False, False]


def test_without_a_limit_only_none_and_all_are_searched() -> None:
    assert recompute_counts(4, limited=False) == (0, 4)
    assert recompute_counts(4, limited=True) == (0, 1, 2, 3, 4)
    assert recompute_counts(8, limited=True) == tuple(range(9))
    assert recompute_counts(20, limited=True) == (0, 1, 2, 4, 8, 16, 20)
    assert recompute_counts(16, limited=True) == (0, 1, 2, 4, 8, 16)


def test_costs_add_the_forward_to_the_backward_of_the_recomputed_stages_only() -> None:
    profile = small_profile(3, blocks=6)
    problem = AutoProblem(profile=profile, ranks=3, methods=("uniform",))
    bounds = ((0, 2), (2, 4), (4, 6))
    candidate = Candidate(schedule="1f1b", method="uniform", depth=3, width=1, chunks=1,
                          pipelines=1, microbatches=6, recompute=2, apc=False, bounds=bounds)
    plan = candidate_plan(candidate, problem)
    assert plan.recompute == (True, True, False)
    table = candidate_costs(candidate, plan, profile, problem).resolve(3)
    blocks = profile.blocks
    for s, (a, e) in enumerate(bounds):
        forward = sum(b.forward for b in blocks[a:e])
        backward = sum(b.backward for b in blocks[a:e])
        assert table.backward[s] == pytest.approx(backward + (forward if s < 2 else 0.0))
        entering = profile.input_bytes if a == 0 else blocks[a - 1].output_bytes
        kept = entering if s < 2 else sum(b.activation_bytes for b in blocks[a:e])
        assert table.activation_bytes[s] == pytest.approx(kept)


def test_a_bool_is_refused_as_a_stage_count() -> None:
    with pytest.raises(TypeError, match="leading stages"):
        Candidate(schedule="1f1b", method="uniform", depth=2, width=1, chunks=1, pipelines=1,
                  microbatches=4, recompute=True, apc=False)
    with pytest.raises(TypeError, match="leading stages"):
        AutoProblem(profile=small_profile(0), ranks=2, recompute=(True,))
