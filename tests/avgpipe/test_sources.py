"""Real runs as the tuner's source: one setting on local processes, measured by the runtime."""

from __future__ import annotations

import pytest

from pipeweave.avgpipe import predict
from pipeweave.measure import profile_real_run, run_setting
from pipeweave.measure.tune_runs import _message_bytes
from pipeweave.models import build_model
from pipeweave.planner.evaluate import Network


def test_message_bytes_are_solved_from_what_each_rank_sent() -> None:
    # rank 0 sends a0 forward; rank 1 a0 back and a1 forward; rank 2 a1 back; 4 messages each
    assert _message_bytes([4 * 10.0, 4 * (10.0 + 20.0), 4 * 20.0], 4) == (10.0, 20.0)
    assert _message_bytes([8.0, 8.0], 2) == (4.0,)


def test_bad_settings_are_refused_before_launching() -> None:
    with pytest.raises(ValueError, match="M=3 does not divide the batch size 4"):
        run_setting("gpt-tiny", stages=2, microbatches=3, batch_size=4)
    with pytest.raises(ValueError, match="warmup >= 1 and iterations >= 1"):
        run_setting("gpt-tiny", stages=2, microbatches=2, batch_size=4, iterations=0)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_real_run_profiles_and_measures_one_setting() -> None:
    run = run_setting("gpt-tiny", stages=2, microbatches=2, pipelines=2, batch_size=4,
                      warmup=1, iterations=2, timeout_s=60.0)
    assert len(run.iteration_s) == 2 and min(run.iteration_s) > 0
    assert run.window[0] < run.window[1] and run.wall_s > sum(run.iteration_s)
    # one message is a micro-batch of 2 sequences x 64 positions x 64 floats (+ a shape header)
    assert run.message_bytes[0] == pytest.approx(2 * 64 * 64 * 4, rel=0.05)
    measured = run.measurement()
    assert measured.memory_bytes == max(run.peak_bytes) and measured.iteration_s == run.median_s
    profile = profile_real_run(run, network=Network(bandwidth=1e9))
    assert profile.source == "measured" and profile.iteration_s == run.median_s
    # the counted peak splits into the N parallel models, the activations and the reference
    # model: one copy of the stage's weights
    spec = build_model("gpt-tiny")
    for k, (start, end) in enumerate([(0, 5), (5, 10)]):
        rank = profile.ranks[k]
        weights = sum(p.numel() * p.element_size() for b in spec.blocks[start:end]
                      for p in b.parameters())
        assert rank.fixed_bytes == weights
        assert rank.memory_bytes == run.peak_bytes[k] and rank.compute_s > 0
    # Equation 8 at the profiled setting gives back what was measured
    assert predict(profile, 2, 2).memory_bytes == pytest.approx(measured.memory_bytes)
