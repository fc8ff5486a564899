"""The measurement layer's small decisions: the sizes ``auto --model`` profiles at, the cores
local ranks share, and the tuner's source refusing what it cannot honour."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeweave.avgpipe.simulated import SimulatedModel
from pipeweave.measure import (DEFAULT_MICROBATCH, auto_microbatch_sizes, local_shared_cores,
                               tuning_profile)
from pipeweave.profiler import BlockProfile, Profile


def _profile(*, device: str = "cpu", source: str = "measured", cores: int | None = 2,
             batch_size: int = 4) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", forward=1e-3 + 1e-4 * batch_size,
                                backward=2e-3 + 2e-4 * batch_size,
                                output_bytes=1e3, activation_bytes=1e3, parameter_bytes=1e3,
                                optimizer_bytes=0.0) for i in range(4))
    metadata = {} if cores is None else {"cores": cores}
    return Profile(blocks, model="toy", batch_size=batch_size, device=device, source=source,
                   metadata=metadata)


def test_auto_profiles_at_the_default_and_every_micro_batch_a_candidate_uses() -> None:
    """The default plan's size first (the others scale from it), then the batch over each
    micro-batch count the search tries (ranks x 1, 2, 4, 8), largest first."""
    assert auto_microbatch_sizes(batch_size=None, ranks=2) == (DEFAULT_MICROBATCH, 8, 2, 1)
    assert auto_microbatch_sizes(batch_size=64, ranks=2) == (16, 32, 8, 4)  # 64 / (2 x 2)
    assert auto_microbatch_sizes(batch_size=8, ranks=4) == (1, 2)   # 8 / 16, 8 / 32: no size
    assert auto_microbatch_sizes(batch_size=None, ranks=2, microbatches=(4, 8)) == (4, 2)
    assert auto_microbatch_sizes(batch_size=None, ranks=2, microbatches=(4,)) == (4, 1)


def test_local_ranks_share_the_cores_only_when_they_outnumber_them() -> None:
    assert local_shared_cores(_profile(cores=2), ranks=4) == 2
    assert local_shared_cores(_profile(cores=2), ranks=2) is None
    assert local_shared_cores(_profile(cores=2, device="cuda"), ranks=4) is None
    assert local_shared_cores(_profile(cores=None, source="synthetic"), ranks=64) is None


def _simulated() -> SimulatedModel:
    return SimulatedModel(profile_at=lambda size: _profile(batch_size=size),
                          bounds=((0, 2), (2, 4)), batch_size=8)


def test_the_tuner_profile_comes_from_the_source_asked_for() -> None:
    simulated = tuning_profile(_simulated(), at=(4, 1), smallest_m=1, batch_size=8)
    assert simulated.source != "measured" and len(simulated.ranks) == 2
    busy = tuning_profile(_simulated(), at=(4, 1), smallest_m=1, batch_size=8,
                          utilisation="busy")
    assert busy.to_json() != simulated.to_json()  # work and per-call overhead, not busy


@pytest.mark.parametrize("options, message", [
    ({"source": "guess"}, "source 'guess'"),
    ({"utilisation": "half"}, "utilisation 'half'"),
    ({"source": "measure"}, "give run"),
])
def test_the_tuner_profile_refuses_what_it_cannot_honour(options: dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tuning_profile(_simulated(), at=(4, 1), smallest_m=1, batch_size=8, **options)
