"""Block times at another micro-batch size (auto/scaling.py): a fixed cost per call plus a
cost per sample, ``a + b m`` per block, fitted between the profiled sizes. Synthetic
profiles whose blocks follow known lines (or curves) give back the lines exactly."""

from __future__ import annotations

import pytest

from pipeweave.auto.scaling import block_time, fit_line, scaled_profile
from pipeweave.profiler import BlockProfile, Profile

LINES = ((2e-4, 5e-5), (0.0, 1e-4), (6e-5, 0.0))
"""Per block: forward ``a`` (s a call) and ``b`` (s a sample); the backward is twice."""


def _profile(size: int, time=lambda a, b, m: a + b * m) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", forward=time(a, b, size),
                                backward=2 * time(a, b, size),
                                weight_grad=time(a, b, size), input_grad=time(a, b, size),
                                output_bytes=100.0 * size, activation_bytes=300.0 * size,
                                parameter_bytes=1e3, optimizer_bytes=2e3, update=1e-4)
                   for i, (a, b) in enumerate(LINES))
    return Profile(blocks, model="toy", batch_size=size, device="synthetic",
                   source="synthetic", input_bytes=10.0 * size)


@pytest.mark.parametrize("sizes", [(1, 4), (2, 3, 8, 16)])
def test_fit_line_recovers_a_and_b(sizes: tuple[int, ...]) -> None:
    a, b = fit_line([(m, 3e-4 + 7e-5 * m) for m in sizes])
    assert a == pytest.approx(3e-4, rel=1e-9) and b == pytest.approx(7e-5, rel=1e-9)
    assert fit_line([(4, 8e-4)]) == (0.0, 2e-4)  # one size: proportional


@pytest.mark.parametrize("size", [1, 2, 3, 6, 8])
def test_every_block_follows_its_own_line_between_the_profiled_sizes(size: int) -> None:
    """Profiled at 4 (the base), 1 and 8: each block's forward, backward, I and W at
    ``size`` are its own ``a + b m`` (not the whole model's ratio); bytes scale with the
    samples; parameters and the update do not."""
    scaled = scaled_profile(_profile(4), size, [_profile(1), _profile(8)])
    assert scaled.batch_size == size and scaled.input_bytes == pytest.approx(10.0 * size)
    for block, (a, b) in zip(scaled.blocks, LINES):
        assert block.forward == pytest.approx(a + b * size, rel=1e-9)
        assert block.backward == pytest.approx(2 * (a + b * size), rel=1e-9)
        assert block.input_grad == pytest.approx(a + b * size, rel=1e-9)
        assert block.weight_grad == pytest.approx(a + b * size, rel=1e-9)
        assert block.output_bytes == pytest.approx(100.0 * size)
        assert block.activation_bytes == pytest.approx(300.0 * size)
        assert block.parameter_bytes == 1e3 and block.update == 1e-4


def test_a_curve_is_followed_piecewise_through_the_profiled_points() -> None:
    """Time m^2 at 1, 2, 4: at 3 the line through 2 and 4 (4 + 6 = 10), not one line
    through all three; the profiled sizes are met exactly."""
    points = [(1, 1.0), (2, 4.0), (4, 16.0)]
    assert block_time(points, 3) == pytest.approx(10.0)
    assert block_time(points, 1.5) == pytest.approx(2.5)
    assert [block_time(points, m) for m, _ in points] == pytest.approx([1.0, 4.0, 16.0])


def test_outside_the_profiled_sizes_the_nearest_segment_within_floors() -> None:
    """Below the smallest: the segment, never below proportional from the smallest (a fixed
    cost cannot turn negative); above the largest: the segment, never below the largest."""
    assert block_time([(2, 3.0), (4, 5.0)], 1) == pytest.approx(2.0)       # a = 1 >= 0
    assert block_time([(2, 1.0), (4, 5.0)], 1) == pytest.approx(0.5)       # a < 0: 1 x 1/2
    assert block_time([(2, 3.0), (4, 5.0)], 8) == pytest.approx(9.0)
    assert block_time([(2, 5.0), (4, 4.0)], 8) == pytest.approx(4.0)       # noise: flat
    assert block_time([(4, 8.0)], 2) == pytest.approx(4.0)                 # proportional


def test_one_profile_scales_proportionally_and_the_base_is_kept() -> None:
    base = _profile(4)
    assert scaled_profile(base, 4, [_profile(1)]) is base
    half = scaled_profile(base, 2)
    for block, original in zip(half.blocks, base.blocks):
        assert block.forward == pytest.approx(original.forward / 2)
