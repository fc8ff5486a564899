"""The AvgPipe tuner's profiles (issue 29 follow-up): ``profile_cache`` profiles the sizes
the tuner will read (``tuning_sizes``) together on first use, their timed runs interleaved
through the profiler's one loop, each size once; a load that rises halfway through then
slows both sizes alike, where asking them one after the other (the old lazy order) times
the second under the higher load. The model is registered once, its blocks on the fake
clock of ``tests/fake_clock.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fake_clock import Block, rising_load, true_ratio
from pipeweave.measure import profile_cache, tuning_sizes
from pipeweave.models import available_models, register_model
from pipeweave.profiler import Profile
from pipeweave.profiler import measure

MODEL = "fake-clock-tune"
BATCH, SMALLEST_M, PROFILED_M = 8, 2, 8
"""The tuner profiles (M, N) = (8, 1) of a batch of 8 and calibrates against M = 2: sizes
1 and 4."""


@dataclass(frozen=True)
class _Config:
    blocks: int = 3


def _registered() -> None:
    if MODEL not in available_models():
        register_model(MODEL, config=_Config(), dataset="digits",
                       build=lambda c: ([Block(features=64) for _ in range(c.blocks)],
                                        [f"b{i}" for i in range(c.blocks)]),
                       loss_fn=lambda out, y: out.float().mean())


def _ratio(small: Profile, large: Profile) -> float:
    return float(sum(b.forward for b in large.blocks) / sum(b.forward for b in small.blocks))


def _sizes() -> tuple[int, ...]:
    return tuning_sizes(at=(PROFILED_M, 1), smallest_m=SMALLEST_M, batch_size=BATCH)


def test_the_tuner_reads_two_sizes_unless_busy() -> None:
    assert _sizes() == (1, 4)
    assert tuning_sizes(at=(8, 1), smallest_m=2, batch_size=8, utilisation="busy") == (1,)
    assert tuning_sizes(at=(2, 1), smallest_m=2, batch_size=8) == (4,)


def _asked(sizes: tuple[int, ...]) -> tuple[Profile, Profile]:
    at = profile_cache(MODEL, sizes=sizes, rounds=2, repeats=3, warmup=1)
    small, large = at(1), at(4)
    assert at(1) is small and at(4) is large  # each size profiled once
    return small, large


def test_the_tuner_sizes_keep_their_ratio_under_a_rising_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _registered()
    small, large = rising_load(monkeypatch, lambda: _asked(_sizes()), [measure])
    assert (small.batch_size, large.batch_size) == (1, 4)
    assert _ratio(small, large) == pytest.approx(true_ratio(1, 4), rel=0.05)


def test_sizes_asked_one_after_the_other_lose_their_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same load, each size profiled when first asked (no ``sizes``): the larger is
    timed under the higher load (so the test above is not passing by accident)."""
    _registered()
    small, large = rising_load(monkeypatch, lambda: _asked(()), [measure])
    assert _ratio(small, large) > 1.3 * true_ratio(1, 4)


def test_without_cache_each_call_profiles_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    _registered()
    calls: list[tuple[int, ...]] = []
    real = measure.profile_builtin_sizes

    def counted(name: str, *, batch_sizes: tuple[int, ...], **options: object) -> tuple[
            Profile, ...]:
        calls.append(tuple(batch_sizes))
        return real(name, batch_sizes=batch_sizes, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(measure, "profile_builtin_sizes", counted)
    at = profile_cache(MODEL, sizes=(1, 4), rounds=1, repeats=1, warmup=0, cache=False)
    at(4), at(4)
    assert calls == [(4,), (4,)]
    cached = profile_cache(MODEL, sizes=(1, 4), rounds=2, repeats=1, warmup=0)
    calls.clear()
    cached(4), cached(1), cached(4)
    assert calls == [(4, 1), (4, 1)]  # two rounds of both sizes, on first use only
