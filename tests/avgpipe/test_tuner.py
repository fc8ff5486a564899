"""The tuner: predictions against the simulator where the paper's assumptions hold exactly,
the choice under a memory limit, traversal, and misuse."""

from __future__ import annotations

import pytest

from pipeweave.avgpipe import Measurement, predict, traverse, tune
from pipeweave.avgpipe.profile import profile_from_simulation
from pipeweave.avgpipe.simulated import simulate_setting
from pipeweave.avgpipe.tuner import held_microbatches, settings
from pipeweave.sim import Costs


def afab_profile(stages: int, m: int, comm: float = 0.0, model: float = 10.0):  # type: ignore[no-untyped-def]
    result = simulate_setting(stages, m, Costs.uniform(1.0, 2.0, comm), advance="all")
    return profile_from_simulation(result, model_bytes=[model] * stages)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("comm", [0.0, 0.5])
@pytest.mark.parametrize("m_star,n_star", [(8, 1), (4, 1), (2, 1), (8, 2), (4, 3), (2, 4)])
def test_interleaved_prediction_is_exact_for_afab(stages: int, comm: float, m_star: int,
                                                  n_star: int) -> None:
    # The paper's assumptions made true: per-micro-batch costs scale with the micro-batch size
    # (m/m*) and so does a message (total communication per batch fixed). Then Equations 1-7
    # reproduce the simulated AFAB iteration of N interleaved pipelines exactly:
    #   T = (n* m* + K - 1)(F + B) m/m* + 2 (K - 1) C m/m*        (uniform, C per message)
    m = 8
    profile = afab_profile(stages, m, comm)
    scale = m / m_star
    truth = simulate_setting(stages, m_star, Costs.uniform(scale, 2 * scale, comm * scale),
                             pipelines=n_star, advance="all")
    prediction = predict(profile, m_star, n_star)
    closed = (n_star * m_star + stages - 1) * 3 * scale + 2 * (stages - 1) * comm * scale
    assert truth.iteration_time == pytest.approx(closed)
    assert prediction.iteration_s == pytest.approx(closed)
    assert prediction.batch_s == pytest.approx(closed / n_star)


def test_equation_1_breakdown_of_the_profiled_setting() -> None:
    # 2 ranks, M = 8, C = 0.5: rank 0 computes 24, is blocked 0.5 by its first message,
    # waits 3.5 for rank 1 (its first micro-batch's 0.5 message + 3 compute): 28 = AFAB's time
    profile = afab_profile(2, 8, 0.5)
    rank0, rank1 = predict(profile, 8, 1).ranks
    assert (rank0.compute_s, rank0.comm_s, rank0.bubble_s) == pytest.approx((24.0, 0.5, 3.5))
    assert (rank1.compute_s, rank1.comm_s, rank1.bubble_s) == pytest.approx((24.0, 0.5, 3.5))
    assert rank0.total_s == pytest.approx(profile.iteration_s) == pytest.approx(28.0)


def test_smaller_micro_batches_follow_the_papers_constant_intensity_rule() -> None:
    # m* = 2m with phi = 1 busy: per micro-batch time unchanged, so twice the compute (§5.2.2)
    profile = afab_profile(2, 4)
    assert predict(profile, 8, 1).ranks[0].compute_s == pytest.approx(2 * 12.0)


def test_concurrent_mode_is_literal_and_agrees_without_extra_pipelines() -> None:
    profile = afab_profile(4, 8, 0.5)
    for m_star in (2, 4, 8):
        a = predict(profile, m_star, 1, mode="interleaved")
        b = predict(profile, m_star, 1, mode="concurrent")
        assert a.iteration_s == pytest.approx(b.iteration_s)
    # saturated busy share: concurrent pipelines cannot share a busy GPU, time per batch stays
    assert predict(profile, 8, 2, mode="concurrent").ranks[0].compute_s == pytest.approx(2 * 24.0)


def test_memory_equation_8_with_and_without_the_held_correction() -> None:
    # 1F1B on 4 ranks, M = 8: rank k holds 4 - k micro-batches of 1 byte; models 10 bytes
    result = simulate_setting(4, 8, Costs.uniform())
    profile = profile_from_simulation(result, model_bytes=[10.0] * 4, fixed_bytes=[3.0] * 4)
    assert [r.data_bytes for r in profile.ranks] == [4.0, 3.0, 2.0, 1.0]
    # M* = 2 (micro-batches 4x larger): rank 0 holds min(4, 2) = 2 of them -> 2 x 4 = 8 bytes
    held = predict(profile, 2, 1)
    assert [r.memory_bytes for r in held.ranks] == [3 + 10 + 8, 3 + 10 + 8, 3 + 10 + 8, 3 + 10 + 4]
    truth = simulate_setting(4, 2, Costs.uniform(activation_bytes=4.0))
    assert [3 + 10 + b for b in truth.peak_activation_bytes] == [r.memory_bytes for r in held.ranks]
    # Equation 8 as printed keeps rank 0's 4 held micro-batches: 4 x 4 = 16 bytes
    assert predict(profile, 2, 1, memory="paper").ranks[0].memory_bytes == 3 + 10 + 16
    # three pipelines: three parallel models and three times the data; fixed bytes once
    assert predict(profile, 8, 3).ranks[0].memory_bytes == 3 + 30 + 12
    assert held_microbatches(0, 4, 8, advance=2) == 6


def test_tune_picks_the_fastest_setting_that_fits() -> None:
    profile = afab_profile(4, 8)
    result = tune(profile, [2, 4, 8], [1, 2, 3])
    assert len(result.predictions) == 9
    assert result.best is not None
    # AFAB time per batch = (M + (K - 1)/N)(F + B) at constant batch work: more pipelines
    assert (result.best.microbatches, result.best.pipelines) == (8, 3)
    # AFAB holds the whole batch: 8 bytes of activations per pipeline, plus 10 of model
    assert {p.memory_bytes for p in result.predictions if p.pipelines == 2} == {36.0}
    limited = tune(profile, [2, 4, 8], [1, 2, 3], memory_limit=40.0)
    assert limited.best is not None and limited.best.memory_bytes <= 40.0
    assert all(p.memory_bytes > 40.0 or p.batch_s >= limited.best.batch_s
               for p in limited.predictions)
    assert (limited.best.microbatches, limited.best.pipelines) == (8, 2)
    assert not limited.feasible(result.best)


def test_traverse_measures_every_setting_and_takes_the_best() -> None:
    calls = []

    def measure(m: int, n: int) -> Measurement:
        calls.append((m, n))
        return Measurement(m, n, iteration_s=n * (6.0 / m + m), memory_bytes=100.0 * n)

    result = traverse(measure, [1, 2, 4], [1, 2], memory_limit=150.0)
    assert calls == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    assert result.best is not None and (result.best.microbatches, result.best.pipelines) == (2, 1)
    assert result.find(4, 2).batch_s == pytest.approx(6.0 / 4 + 4)


def test_misuse_fails_with_clear_messages() -> None:
    profile = afab_profile(2, 4, model=50.0)
    with pytest.raises(ValueError, match="below the model size"):
        tune(profile, [2, 4], [1], memory_limit=10.0)
    with pytest.raises(ValueError, match="do not divide the batch size 12"):
        settings([4, 5], [1], batch_size=12)
    with pytest.raises(ValueError, match="grid is empty"):
        settings([], [1])
    with pytest.raises(ValueError, match="pipelines must be an integer >= 1"):
        predict(profile, 4, 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        predict(profile, 4, 1, mode="bogus")  # type: ignore[arg-type]


def test_per_iteration_work_scales_with_n_not_m() -> None:
    # optimizer steps and averaging: once per pipeline per iteration, whatever M
    import dataclasses

    base = afab_profile(2, 8)
    stepped = dataclasses.replace(base, ranks=tuple(dataclasses.replace(r, update_s=1.0)
                                                    for r in base.ranks))
    for m_star, n_star in [(8, 1), (2, 1), (4, 3)]:
        plain, more = predict(base, m_star, n_star), predict(stepped, m_star, n_star)
        assert [b.compute_s - a.compute_s for a, b in zip(plain.ranks, more.ranks)] == \
            pytest.approx([n_star * 1.0] * 2)
        assert [b.bubble_s for b in more.ranks] == pytest.approx([a.bubble_s for a in plain.ranks])
