"""APC's codec priced: half a round trip of the profile's measured rate at each end of every
message crossing ranks, on the F and B that send or receive it. Expected times are derived
by hand for a two-stage GPipe with one micro-batch, whose iteration is one chain."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeweave.auto import AutoProblem, search
from pipeweave.auto.predict import simulate_candidate
from pipeweave.auto.problem import Candidate
from pipeweave.profiler import BlockProfile, LinkProfile, Profile

F0, B0, F1, B1 = 1e-3, 2e-3, 1.5e-3, 2.5e-3
MESSAGE = 4e6  # bytes block 0 sends block 1 (and the gradient back)
BANDWIDTH, LATENCY = 1e9, 1e-5


def _profile(rate: float | None, bandwidth: float = BANDWIDTH) -> Profile:
    blocks = (BlockProfile("a", F0, B0, output_bytes=MESSAGE, activation_bytes=1e5,
                           parameter_bytes=1e5),
              BlockProfile("b", F1, B1, output_bytes=8.0, activation_bytes=1e5,
                           parameter_bytes=1e5))
    return Profile(blocks, batch_size=4, link=LinkProfile(bandwidth, LATENCY),
                   apc_bytes_per_second=rate)


def _iteration(profile: Profile, apc: bool) -> float:
    problem = AutoProblem(profile=profile, ranks=2, batch_size=4, semantics="any")
    candidate = Candidate(schedule="gpipe", method="uniform", depth=2, width=1, chunks=1,
                          pipelines=1, microbatches=1, recompute=0, apc=apc,
                          bounds=((0, 1), (1, 2)))
    return simulate_candidate(candidate, profile, problem).iteration_time


@pytest.mark.parametrize("rate", [2e8, 5e9])
def test_the_codec_is_in_the_simulated_time_as_derived_by_hand(rate: float) -> None:
    send = LATENCY + MESSAGE / BANDWIDTH / 2  # fp16 on the wire
    codec = MESSAGE / (2 * rate)  # half a round trip at each end
    # F0 encodes, F1 decodes, B1 encodes the input gradient, B0 decodes it: 4 codec halves
    expected = F0 + codec + send + codec + F1 + B1 + codec + send + codec + B0
    assert _iteration(_profile(rate), apc=True) == pytest.approx(expected, rel=1e-12)
    plain = F0 + LATENCY + MESSAGE / BANDWIDTH + F1 + B1 + LATENCY + MESSAGE / BANDWIDTH + B0
    assert _iteration(_profile(rate), apc=False) == pytest.approx(plain, rel=1e-12)


def test_an_unmeasured_rate_leaves_the_codec_free() -> None:
    send = LATENCY + MESSAGE / BANDWIDTH / 2
    assert _iteration(_profile(None), apc=True) == pytest.approx(
        F0 + send + F1 + B1 + send + B0, rel=1e-12)


def _winner_apc(rate: float, bandwidth: float) -> bool:
    problem = AutoProblem(profile=_profile(rate, bandwidth), ranks=2, batch_size=16,
                          semantics="any", methods=("uniform",), depths=(2,))
    return search(problem).winner.candidate.apc  # depth 2: a boundary to compress


def test_a_slow_codec_is_never_chosen_and_a_fast_one_on_a_slow_link_is() -> None:
    assert not _winner_apc(rate=1e6, bandwidth=1e7)  # converting costs more than sending
    assert _winner_apc(rate=1e14, bandwidth=1e7)      # nearly free: half the bytes wins
    assert not _winner_apc(rate=2e9, bandwidth=1e14)  # a free link: nothing to gain


def test_the_rate_survives_json_and_old_profiles_have_none() -> None:
    profile = _profile(3.5e9)
    assert Profile.from_json(profile.to_json()).apc_bytes_per_second == 3.5e9
    old = profile.to_json()
    del old["apc_bytes_per_second"]
    assert Profile.from_json(old).apc_bytes_per_second is None
    with pytest.raises(ValueError, match="apc_bytes_per_second must be > 0"):
        replace(profile, apc_bytes_per_second=0.0)
