"""Micro-batch sizes profiled interleaved (issue 29, item 2): a load that rises halfway
through profiling slows every size alike, so the sizes' ratio stays the device's.

The blocks run on a fake clock: each forward (backward) advances it by ``load x (a + b m)``
(twice that) for ``m`` samples, the load rising from 1 to 3 halfway through the profiling.
Profiled one size after the other (the old order), the second size is timed under the higher
load and the ratio of the sizes' times is off by up to 3x; interleaved, it is the cost
model's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from fake_clock import Block, rising_load, true_ratio
from pipeweave.models import ModelSpec
from pipeweave.profiler import Profile
from pipeweave.profiler import measure
from pipeweave.profiler.measure import profile_model, profile_model_sizes

SIZES = (1, 4)
TRUE_RATIO = true_ratio(*SIZES)


def _spec() -> ModelSpec:
    torch.manual_seed(0)
    blocks = tuple(Block() for _ in range(4))
    return ModelSpec(name="drift", blocks=blocks, block_names=("a", "b", "c", "d"),
                     loss_fn=lambda out, y: ((out - y) ** 2).mean())


def _batches() -> list[tuple[Tensor, Tensor | None]]:
    return [(torch.randn(m, 8), None) for m in SIZES]


def _interleaved() -> tuple[Profile, ...]:
    return profile_model_sizes(_spec(), _batches(), warmup=1, repeats=5)


def _sequential() -> tuple[Profile, ...]:
    return tuple(profile_model(_spec(), x, y, warmup=1, repeats=5) for x, y in _batches())


def _profiled(monkeypatch: pytest.MonkeyPatch, how: Any) -> tuple[Profile, ...]:
    """``how()`` on the fake clock, the load rising halfway through its own flat-load run."""
    profiles: tuple[Profile, ...] = rising_load(monkeypatch, how, [measure])
    return profiles


def _ratio(profiles: tuple[Profile, ...], field: str) -> float:
    small, large = (sum(getattr(b, field) for b in p.blocks) for p in profiles)
    return float(large / small)


@pytest.mark.parametrize("field", ["forward", "backward"])
def test_interleaved_sizes_keep_their_ratio_under_a_rising_load(
        monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    profiles = _profiled(monkeypatch, _interleaved)
    assert [p.batch_size for p in profiles] == list(SIZES)
    assert _ratio(profiles, field) == pytest.approx(TRUE_RATIO, rel=0.05)
    # block by block too, but for the one block the load rose in
    ratios = [getattr(large, field) / getattr(small, field)
              for small, large in zip(profiles[0].blocks, profiles[1].blocks)]
    assert sum(r != pytest.approx(TRUE_RATIO, rel=0.02) for r in ratios) <= 1, ratios


def test_sizes_profiled_one_after_the_other_lose_their_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same load against the old order: the larger size is timed under the higher load
    (so the interleaved test above is not passing by accident)."""
    profiles = _profiled(monkeypatch, _sequential)
    assert _ratio(profiles, "forward") > 1.3 * TRUE_RATIO


def test_one_size_profiles_as_before() -> None:
    """``profile_model`` is the one-size case: the same facts as each size of a pair."""
    x = torch.randn(2, 8)
    alone = profile_model(_spec(), x, None, warmup=0, repeats=1)
    (first, _) = profile_model_sizes(_spec(), [(x, None), (torch.randn(4, 8), None)],
                                     warmup=0, repeats=1)
    assert alone.batch_size == first.batch_size == 2
    for a, b in zip(alone.blocks, first.blocks):
        assert (a.output_bytes, a.activation_bytes, a.parameter_bytes) == \
            (b.output_bytes, b.activation_bytes, b.parameter_bytes)


def test_no_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        profile_model_sizes(_spec(), [])
