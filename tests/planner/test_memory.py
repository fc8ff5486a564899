"""Predicted peak memory per rank (planner/memory.py) against hand-derived counts.

The synthetic profile has one block per stage with round numbers, so every expectation below
is written from the schedules' definitions (the papers' counts), not from the code:

    W = 1000 parameter bytes per block, A = 100 saved bytes, O = 10 output bytes,
    profiled at batch_size 1, so a plan's micro-batch of ``rows`` rows holds ``rows x`` these.
"""

from __future__ import annotations

import pytest

from dataclasses import replace

from pipeweave.planner import Plan, Semantics
from pipeweave.planner.memory import RankMemory, predicted_memory
from pipeweave.profiler import BlockProfile, Profile

W, A, O, INPUT = 1000.0, 100.0, 10.0, 7.0
HELD = A + O  # what one micro-batch leaves on a stage: saved tensors + the stage's output
LAST = A  # on the last stage the output is the loss (a scalar): the saved tensors only


def profile(blocks: int, weights: float = W) -> Profile:
    return Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, O, A, weights) for i in range(blocks)),
                   batch_size=1, input_bytes=INPUT)


def memory(plan: Plan, batch_size: int | None = None, weights: float = W,
           **kwargs: object) -> list[RankMemory]:
    return predicted_memory(profile(plan.num_blocks, weights), plan,
                            batch_size=batch_size or plan.microbatches, **kwargs)  # type: ignore[arg-type]


def held(plan: Plan, batch_size: int | None = None) -> list[float]:
    """Activations at each rank's peak, without weights (so no gradients shift the peak)."""
    return [r.activations for r in memory(plan, batch_size, weights=0.0)]


def test_1f1b_holds_p_minus_rank_microbatches() -> None:
    # 1F1B (pipedream.txt §3.2, WPipe Table 1): rank r warms up with P - r forwards before its
    # first backward, then alternates, so it never holds more than P - r activations.
    assert held(Plan.uniform(4, 4, schedule="1f1b", microbatches=8)) == [
        4 * HELD, 3 * HELD, 2 * HELD, 1 * LAST]


def test_gpipe_holds_every_microbatch() -> None:
    # GPipe runs all M forwards before any backward: M activations on every rank.
    assert held(Plan.uniform(4, 4, schedule="gpipe", microbatches=8)) == [8 * HELD] * 3 + [8 * LAST]


def test_activations_scale_to_the_plan_microbatch() -> None:
    # batch 32 in M=8 micro-batches: 4 rows each, the profile's bytes are per row here.
    assert held(Plan.uniform(4, 4, schedule="gpipe", microbatches=8), batch_size=32)[0] == \
        8 * 4 * HELD


def test_buffers_follow_the_transport() -> None:
    # 1F1B, 2 ranks, M=4. The last rank runs RF0 F0 B0 SB0 RF1 F1 B1 SB1 RF2 F2 ... The
    # interpreter posts two receives ahead: RF0 and RF1 at the start, RF2 once RF0 is in, RF3
    # once RF1 is in; a received activation is a buffer until its forward takes it. SB0 (the
    # input gradient it sent) stays alive until RF2 arrives: rank 0 sent that activation after
    # receiving SB0, which proves SB0 delivered. At F1 the rank holds RF2, RF3 and SB0: the
    # most at any moment, 3 messages of O bytes (and one micro-batch's A).
    last = memory(Plan.uniform(2, 2, schedule="1f1b", microbatches=4), weights=0.0)[1]
    assert (last.activations, last.buffers) == (LAST, 3 * O)


def test_recomputation_keeps_only_stage_inputs() -> None:
    # A recomputed stage keeps its input (the previous block's output, or the model's input on
    # stage 0) per micro-batch, not its saved tensors.
    plan = Plan.uniform(4, 4, schedule="1f1b", microbatches=8, recompute=(True, True, False, False))
    assert held(plan) == [4 * INPUT, 3 * O, 2 * HELD, 1 * LAST]


def test_model_state_by_optimizer() -> None:
    plan = Plan.uniform(8, 2, schedule="1f1b", microbatches=4)  # 4 blocks per rank
    adam = memory(plan, optimizer="adam")[0]
    assert (adam.parameters, adam.gradients, adam.optimizer_state) == (4 * W, 4 * W, 8 * W)
    assert memory(plan, optimizer="adamw")[0].optimizer_state == 8 * W
    assert memory(plan, optimizer="sgd")[0].optimizer_state == 0
    assert memory(plan, optimizer="sgd-momentum")[0].optimizer_state == 4 * W
    assert adam.total == 16 * W + adam.weight_versions + adam.activations + adam.buffers


def test_measured_optimizer_state_is_used_for_the_profiled_optimizer() -> None:
    # The profiler measured the state of the optimizer it ran (metadata "optimizer"); another
    # optimizer's state is counted from the parameters.
    plan = Plan.uniform(2, 2, schedule="1f1b", microbatches=4)
    measured = Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, O, A, W, optimizer_bytes=2 * W + 8)
                             for i in range(2)), batch_size=1, metadata={"optimizer": "adam"})
    assert predicted_memory(measured, plan, batch_size=4)[0].optimizer_state == 2 * W + 8
    assert predicted_memory(measured, plan, batch_size=4,
                            optimizer="sgd-momentum")[0].optimizer_state == W


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


def test_gradients_overlap_the_activations_the_first_backward_frees() -> None:
    # GPipe holds all M = 4 activations when its first backward starts. That backward creates
    # the weight gradients (W) block by block while it frees its micro-batch's saved tensors
    # (HELD), so at its moment only W - HELD of them count on top of the 4 HELD held; at the
    # second backward, 3 HELD and all of W: the same 3 HELD + W. The first is reported.
    rank = memory(Plan.uniform(2, 2, schedule="gpipe", microbatches=4))[0]
    assert (rank.activations, rank.gradients) == (4 * HELD, W - HELD)


def split_profile() -> Profile:
    # P bytes of output gradients wait from I to W; R bytes of unsaved outputs from F to W.
    return Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, O, A, W, pending_bytes=P,
                                      recorded_bytes=R) for i in range(2)), batch_size=1)


P, R = 1000.0, 10000.0


def test_split_backward_keeps_pending_gradients_until_w() -> None:
    # zb-h1, 2 ranks, M=4. Last stage: F0 I0 F1 I1 W0 F2 I2 W1 ...: at W1 it holds micro-
    # batches 1 and 2 (each A + R from its F, P from its I) and the gradients W0 created (W0
    # itself created them while freeing more than W of micro-batch 0). The first stage's
    # I is directly followed by its W (nothing to send back), which the runtime runs as one B:
    # it holds 1F1B's P = 2 micro-batches and keeps nothing for a W.
    first, last = predicted_memory(split_profile(), Plan.uniform(2, 2, schedule="zb-h1",
                                                                 microbatches=4), batch_size=4)
    assert (last.activations, last.gradients) == (2 * (A + R + P), W)
    assert first.activations == 2 * HELD


def test_predicted_forwards_keep_only_their_input() -> None:
    # PipeOptim (default backward="recompute", Algorithm 1): stage 0 forwards on predicted
    # weights (F@v~1) without a graph and its backward recomputes at the current weights, so
    # an in-flight micro-batch holds the stage input, and the backward rebuilds the rest.
    # Only the very first forward (F0@0, nothing to predict yet) keeps its graph. Every
    # backward then sees HELD + INPUT (F0's graph and F1's input at B0; two inputs and the
    # rebuilt graph later); one replica holds the predicted weights.
    plan = Plan.uniform(2, 2, schedule="pipeoptim", microbatches=4)
    first = memory(plan, weights=0.0)[0]
    assert first.activations + first.workspace == HELD + INPUT
    assert memory(plan)[0].weight_versions == W
    graph = memory(replace(plan, semantics=Semantics(backward="graph")), weights=0.0)[0]
    assert graph.activations == 2 * HELD  # backward="graph" keeps the predicted graph


def test_activations_alone_match_the_simulator_peak() -> None:
    # With no gradients, outputs, workspace or split-backward extras, the walk's peak activations are
    # the simulator's peak held bytes (sim.metrics.peak_activations) for every schedule.
    from pipeweave.ir import lower
    from pipeweave.schedules import available_schedules, build_schedule
    from pipeweave.sim import Costs, simulate

    bare = Profile(tuple(BlockProfile(f"b{i}", 1.0, 2.0, 0.0, A, 0.0) for i in range(8)),
                   batch_size=1)
    for info in available_schedules():
        if info.name in ("pipeoptim", "spectrain"):  # forwards without a graph hold less
            continue
        plan = Plan.uniform(8, 2, chunks=info.default_chunks, schedule=info.name, microbatches=4)
        held = [(e - a) * A for a, e in plan.stages]
        schedule = lower(build_schedule(plan.schedule, plan.shape(1 if info.synchronous else 4)))
        expected = simulate(schedule, Costs(activation_bytes=held)).peak_activation_bytes
        got = [r.activations for r in predicted_memory(bare, plan, batch_size=4)]
        assert got == expected, info.name


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_prediction_is_within_10_percent_of_the_measured_peak_on_gpt_tiny() -> None:
    # The oracle is the allocator: every rank's peak of live tensor bytes, measured by the
    # run itself (Job.track_allocations), against the prediction from the profile and plan.
    from pipeweave.models import default_seq_len
    from pipeweave.profiler.measure import profile_builtin
    from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, launch_local

    batch, microbatches = 16, 4
    measured_profile = profile_builtin("gpt-tiny", batch_size=batch // microbatches, warmup=0,
                                       repeats=1, optimizer="adam")
    for schedule in ("1f1b", "gpipe"):
        plan = Plan.uniform(measured_profile.num_blocks, 2, schedule=schedule,
                            microbatches=microbatches)
        job = Job(plan=plan, steps=2, model=BuiltinModel("gpt-tiny"),
                  data=BuiltinData("stdlib-bytes", batch_size=batch,
                                   seq_len=default_seq_len("gpt-tiny")),
                  optimizer=OptimizerFactory("adam"), track_allocations=True,
                  record_timeline=False, timeout_s=120.0)
        measured = [r.peak_allocated_bytes for r in sorted(launch_local(job), key=lambda r: r.rank)]
        predicted = [r.total for r in predicted_memory(measured_profile, plan, batch_size=batch)]
        assert all(m > 0 for m in measured), measured
        errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
        assert max(errors) < 0.10, (schedule, predicted, measured)
