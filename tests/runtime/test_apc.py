"""Automatic precision compression: bounded error, fallback, half the bytes."""

import pytest
import torch

from pipeweave.apc import MODE_FULL, MODE_HALF, decode, encode


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 1e3, 1e7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_trip_error_is_fp16_rounding(scale: float, dtype: torch.dtype) -> None:
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0), dtype=dtype) * scale
    encoded = encode(x)
    assert encoded.mode == MODE_HALF and encoded.payload.dtype == torch.float16
    y = decode(encoded, dtype)
    assert y.dtype == dtype
    # each element: relative error <= 2**-11 (fp16 rounding) unless it is tiny (subnormal range)
    big = x.abs() > x.abs().max() * 2.0**-10
    assert ((y - x).abs()[big] <= x.abs()[big] * 2.0**-11).all()
    assert (y - x).abs().max() <= x.abs().max() * 2.0**-11


def test_halves_the_bytes() -> None:
    x = torch.randn(128, 16)
    encoded = encode(x)
    assert encoded.payload.numel() * encoded.payload.element_size() * 2 == x.numel() * x.element_size()


def test_overflowing_input_falls_back() -> None:
    x = torch.tensor([1.0, float("inf"), 2.0])
    encoded = encode(x)
    assert encoded.mode == MODE_FULL and torch.equal(decode(encoded, torch.float32), x)


def test_large_dynamic_range_underflows_and_falls_back() -> None:
    x = torch.cat([torch.full((10,), 1e6), torch.full((10,), 1e-9)])
    encoded = encode(x)
    assert encoded.mode == MODE_FULL and torch.equal(decode(encoded, torch.float32), x)
    assert encode(x, underflow_tolerance=0.6).mode == MODE_HALF


def test_zeros_and_integers() -> None:
    assert encode(torch.zeros(4)).mode == MODE_HALF
    ids = torch.arange(5)
    assert encode(ids).mode == MODE_FULL and torch.equal(decode(encode(ids), torch.int64), ids)
