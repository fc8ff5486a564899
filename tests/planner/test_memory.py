"""Predicted peak memory per rank (planner/memory.py) against hand-derived counts.

The synthetic profile has one block per stage with round numbers, so every expectation below
is written from the schedules' definitions (the papers' counts), not from the code:

    W = 1000 parameter bytes per block, A = 100 saved bytes, O = 10 output bytes,
    profiled at batch_size 1, so a plan's micro-batch of ``rows`` rows holds ``rows x`` these.
"""

from __future__ import annotations

import pytest

from pipeweave.planner import Plan
from pipeweave.planner.memory import RankMemory, predicted_memory
from pipeweave.profiler import BlockProfile, Profile

W, A, O, INPUT = 1000.0, 100.0, 10.0, 7.0
HELD = A + O  # what one micro-batch leaves on a stage: saved tensors + the stage's output


def profile(blocks: int) -> Profile:
    return Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, O, A, W) for i in range(blocks)),
                   batch_size=1, input_bytes=INPUT)


def memory(plan: Plan, batch_size: int | None = None, **kwargs: object) -> list[RankMemory]:
    return predicted_memory(profile(plan.num_blocks), plan,
                            batch_size=batch_size or plan.microbatches, **kwargs)  # type: ignore[arg-type]


def test_1f1b_holds_p_minus_rank_microbatches() -> None:
    # 1F1B (pipedream.txt §3.2, WPipe Table 1): rank r warms up with P - r forwards before its
    # first backward, then alternates, so it never holds more than P - r activations.
    ranks = memory(Plan.uniform(4, 4, schedule="1f1b", microbatches=8))
    assert [r.activations for r in ranks] == [4 * HELD, 3 * HELD, 2 * HELD, 1 * HELD]


def test_gpipe_holds_every_microbatch() -> None:
    # GPipe runs all M forwards before any backward: M activations on every rank.
    ranks = memory(Plan.uniform(4, 4, schedule="gpipe", microbatches=8))
    assert [r.activations for r in ranks] == [8 * HELD] * 4


def test_activations_scale_to_the_plan_microbatch() -> None:
    # batch 32 in M=8 micro-batches: 4 rows each, the profile's bytes are per row here.
    ranks = memory(Plan.uniform(4, 4, schedule="gpipe", microbatches=8), batch_size=32)
    assert ranks[0].activations == 8 * 4 * HELD
    assert ranks[1].buffers == 4 * (O + O)  # its input activation and its output's gradient


def test_recomputation_keeps_only_stage_inputs() -> None:
    # A recomputed stage keeps its input (the previous block's output, or the model's input on
    # stage 0) per micro-batch, not its saved tensors.
    plan = Plan.uniform(4, 4, schedule="1f1b", microbatches=8, recompute=(True, True, False, False))
    ranks = memory(plan)
    assert [r.activations for r in ranks] == [4 * INPUT, 3 * O, 2 * HELD, 1 * HELD]


def test_model_state_by_optimizer() -> None:
    plan = Plan.uniform(8, 2, schedule="1f1b", microbatches=4)  # 4 blocks per rank
    adam = memory(plan, optimizer="adam")[0]
    assert (adam.parameters, adam.gradients, adam.optimizer_state) == (4 * W, 4 * W, 8 * W)
    assert memory(plan, optimizer="adamw")[0].optimizer_state == 8 * W
    assert memory(plan, optimizer="sgd")[0].optimizer_state == 0
    assert memory(plan, optimizer="sgd-momentum")[0].optimizer_state == 4 * W
    assert adam.total == 16 * W + adam.weight_versions + adam.activations + adam.buffers


def test_synchronous_schedules_keep_no_weight_copies() -> None:
    for name in ("gpipe", "1f1b"):
        assert all(r.weight_versions == 0 for r in memory(Plan.uniform(3, 3, schedule=name,
                                                                       microbatches=6)))


def test_pipedream_stashes_n_minus_k_plus_one_versions() -> None:
    # PipeDream (pipedream.txt §3.3): stage k of n keeps n - k + 1 versions. On every stage but
    # the last, each forward's backward comes after an update, so the runtime runs it on a copy
    # of the weights (the live ones change in place): n - k + 1 copies; the last stage runs F
    # and B back to back on the live weights.
    ranks = memory(Plan.uniform(3, 3, schedule="pipedream", microbatches=6))
    assert [r.weight_versions for r in ranks] == [3 * W, 2 * W, 0]


def test_2bw_keeps_two_versions() -> None:
    # PipeDream-2BW (wpipe.txt §2): forwards use the version before the last update. Stage 0
    # holds the outgoing version for its in-flight micro-batches and runs the forwards of the
    # new period on a copy too (their backward follows the next update): 2 copies. The last
    # stage only keeps the older version its forwards name: 1 copy.
    ranks = memory(Plan.uniform(2, 2, schedule="2bw", microbatches=4))
    assert [r.weight_versions for r in ranks] == [2 * W, 1 * W]


def test_v_placement_counts_both_halves() -> None:
    # A V places stages r and 2P-1-r on rank r: two blocks of parameters on every rank.
    ranks = memory(Plan.uniform(4, 2, chunks=2, schedule="zbv", microbatches=4))
    assert [r.parameters for r in ranks] == [2 * W, 2 * W]


def test_parallel_pipelines_keep_their_own_state_and_a_reference() -> None:
    # AvgPipe: N pipelines each keep parameters, gradients and optimizer state; elastic
    # averaging adds one reference model (avgpipe.txt §3.2).
    plan = Plan.uniform(2, 2, schedule="avgpipe", microbatches=4, pipelines=2)
    rank = memory(plan)[0]
    assert (rank.parameters, rank.gradients, rank.optimizer_state) == (3 * W, 2 * W, 4 * W)


def test_bad_arguments_name_the_fix() -> None:
    plan = Plan.uniform(2, 2, schedule="1f1b", microbatches=4)
    with pytest.raises(ValueError, match="optimizer 'lion'"):
        memory(plan, optimizer="lion")
    with pytest.raises(ValueError, match="not divisible by microbatches=4"):
        memory(plan, batch_size=6)
    with pytest.raises(ValueError, match="profile has 3 blocks"):
        predicted_memory(profile(3), plan, batch_size=4)
