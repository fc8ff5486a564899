"""TuningProfile from timelines: busy share, utilisation histogram, communication, memory."""

from __future__ import annotations

from typing import Any

import pytest

from pipeweave.avgpipe.profile import (TuningProfile, busy_segments, host_segments,
                                       profile_from_simulation, profile_from_timeline,
                                       utilisation_histogram)
from pipeweave.avgpipe.simulated import simulate_setting
from pipeweave.sim import Costs

# GPipe, 2 ranks, M = 2, F = 1, B = 2, one message takes 0.5 (lowered: receives recorded)
RECORDS = [
    (0, "0F0", 0.0, 1.0), (0, "0F1", 1.0, 2.0), (0, "0RB1", 2.0, 5.5), (0, "0B1", 5.5, 7.5),
    (0, "0RB0", 7.5, 7.5), (0, "0B0", 7.5, 9.5),
    (1, "1RF0", 0.0, 1.5), (1, "1F0", 1.5, 2.5), (1, "1RF1", 2.5, 2.5), (1, "1F1", 2.5, 3.5),
    (1, "1B1", 3.5, 5.5), (1, "1B0", 5.5, 7.5),
]


def test_busy_segments_merge_compute_and_skip_communication() -> None:
    assert busy_segments(RECORDS, 0, (0.0, 9.5)) == [(0.0, 2.0), (5.5, 9.5)]
    assert busy_segments(RECORDS, 1, (0.0, 9.5)) == [(1.5, 7.5)]
    assert busy_segments(RECORDS, 1, (2.0, 3.0)) == [(2.0, 3.0)]  # clipped to the window


def test_utilisation_is_the_busy_share_exact_or_binned() -> None:
    segments = [(0.0, 2.0), (5.5, 9.5)]
    assert utilisation_histogram(segments, (0.0, 9.5)) == [(1.0, 6.0), (0.0, 3.5)]
    assert utilisation_histogram(segments, (0.0, 9.5), levels=((1.0, 0.5), (0.0, 0.5))) == [(1.0, 3.0), (0.0, 6.5)]
    # 4-s bins: [0,4) 50 % busy, [4,8) 62.5 %, [8,9.5) 100 %
    assert utilisation_histogram(segments, (0.0, 9.5), bin_s=4.0) == [
        (1.0, 1.5), (0.625, 4.0), (0.5, 4.0)]


def test_profile_from_timeline_per_iteration() -> None:
    profile = profile_from_timeline(
        RECORDS, stages=2, microbatches=2, pipelines=1, iterations=1, transfer_s=[0.5],
        model_bytes=[100.0, 200.0], data_bytes=[20.0, 10.0], fixed_bytes=[5.0, 5.0])
    first, last = profile.ranks
    assert profile.iteration_s == 9.5
    assert (first.compute_s, first.idle_s) == (6.0, 3.5)
    assert (last.compute_s, last.idle_s) == (6.0, 3.5)
    # each rank receives M messages of 0.5 (gradients to rank 0, activations to rank 1)
    assert first.comm_total_s == last.comm_total_s == 1.0
    assert first.receive_wait_s == 3.5 and last.receive_wait_s == 1.5
    assert first.utilisation == ((1.0, 6.0), (0.0, 3.5))
    assert first.memory_bytes == 125.0
    assert TuningProfile.from_json(profile.to_json()) == profile


def test_profile_from_simulation_matches_the_simulated_run() -> None:
    # AFAB, 3 stages, M = 4, comm 0.5: every rank computes 4 x 3 = 12 per iteration
    result = simulate_setting(3, 4, Costs.uniform(1.0, 2.0, 0.5), advance="all", iterations=2)
    profile = profile_from_simulation(result, model_bytes=[8.0] * 3)
    assert profile.advance == 3 and profile.microbatches == 4 and profile.pipelines == 1
    assert profile.iteration_s == pytest.approx(result.iteration_time)
    assert [r.compute_s for r in profile.ranks] == [12.0, 12.0, 12.0]
    # rank 0 receives 4 gradients, rank 1 4 activations and 4 gradients, rank 2 4 activations
    assert [r.comm_total_s for r in profile.ranks] == [2.0, 4.0, 2.0]
    assert [r.data_bytes for r in profile.ranks] == [4.0, 4.0, 4.0]  # AFAB holds all M


def test_profile_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="one per boundary"):
        profile_from_timeline(RECORDS, stages=2, microbatches=2, pipelines=1, iterations=1,
                              transfer_s=[], model_bytes=[1, 1], data_bytes=[1, 1])
    with pytest.raises(ValueError, match="one per rank"):
        profile_from_timeline(RECORDS, stages=2, microbatches=2, pipelines=1, iterations=1,
                              transfer_s=[0.5], model_bytes=[1], data_bytes=[1, 1])
    with pytest.raises(ValueError, match="no records"):
        profile_from_timeline([], stages=2, microbatches=2, pipelines=1, iterations=1,
                              transfer_s=[0.5], model_bytes=[1, 1], data_bytes=[1, 1])
    with pytest.raises(ValueError, match="pipelines must be an integer >= 1"):
        TuningProfile(microbatches=2, pipelines=0, iteration_s=1.0, ranks=())


# one iteration of rank 0, M = 1: forward, send, glue, wait for the gradient, backward, step
HOST = [(0, "0F0", 0.0, 1.0), (0, "0SF0", 1.0, 1.25), (0, "0RB0", 1.5, 3.0), (0, "0B0", 3.0, 5.0),
        (0, "0U@1", 5.0, 5.5), (0, "0AV@1", 5.5, 6.0)]


def test_host_busy_counts_all_but_waiting_and_steps_apart() -> None:
    # compute only: F and B; host: also the send and the glue before the receive
    assert busy_segments(HOST, 0, (0.0, 6.0), per_iteration=False) == [(0.0, 1.0), (3.0, 5.0)]
    assert host_segments(HOST, 0, (0.0, 6.0), 1) == [(0.0, 1.5), (3.0, 5.0)]
    kwargs: dict[str, Any] = dict(stages=1, microbatches=1, pipelines=1, iterations=1, transfer_s=[],
                  model_bytes=[1.0], data_bytes=[1.0])
    compute = profile_from_timeline(HOST, **kwargs).ranks[0]
    host = profile_from_timeline(HOST, busy="host", **kwargs).ranks[0]
    assert (compute.compute_s, compute.update_s, compute.idle_s) == (3.0, 1.0, 2.0)
    assert (host.compute_s, host.update_s, host.idle_s) == (3.5, 1.0, 1.5)
    with pytest.raises(ValueError, match="busy must be 'compute' or 'host'"):
        profile_from_timeline(HOST, busy="all", **kwargs)
