"""Automatic precision compression: bounded error, fallback, half the bytes."""

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

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


class _OneDevice(TorchDispatchMode):
    """Records every op whose tensors are on more than one device; answers host reads of
    meta tensors (``.item()``, ``float()``) as a device holding a tame tensor would: ``value``
    for a float, True for a bool, 0 for a count."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        tensors = [t for t in pytree.tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
        if func is torch.ops.aten._local_scalar_dense.default and tensors[0].is_meta:
            dtype = tensors[0].dtype
            return (True if dtype == torch.bool else self.value if dtype.is_floating_point
                    else 0)
        if len({t.device for t in tensors}) > 1:
            self.mixed.append(f"{func}: {[str(t.device) for t in tensors]}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_codec_keeps_every_tensor_on_the_input_device(dtype: torch.dtype) -> None:
    # A CPU exponent beside a CUDA tensor stops torch's ldexp on a GPU (pipeweave profile
    # --device cuda did); the meta device shows every tensor the codec makes, without one.
    x = torch.empty(8, 4, dtype=dtype, device="meta")
    with _OneDevice(value=3.0) as mode:
        encoded = encode(x)
        restored = decode(encoded, dtype)
    assert encoded.mode == MODE_HALF and encoded.payload.is_meta and restored.is_meta
    assert mode.mixed == []
