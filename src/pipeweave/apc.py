"""Automatic precision compression (APC) of activations and gradients crossing ranks.

The codec alone (no transport): ``runtime/communication/transport.py`` puts it on the wire and
``profiler/apc_rate.py`` times it, so it sits below both.

WPipe §4 (communication compression, Fig. 12): the sender divides the tensor by a power-of-two
*scaler* and converts it to half precision; if the conversion succeeds it sends the fp16
tensor and the scaler, otherwise the full-precision tensor. The receiver multiplies back.

Here the scaler is ``2**e`` with ``e = ceil(log2(max|x|)) - 14``, which maps the largest
magnitude into ``[2**13, 2**14]`` — far below fp16's overflow (65504) and using the top of its
range, so the fewest small values fall below fp16's smallest subnormal (``2**-24``). The
conversion *fails* (full precision is sent) when the input holds inf/nan, when anything would
overflow, or when more than ``underflow_tolerance`` of the non-zero elements would flush to
zero. Multiplying by a power of two is exact, so the only error is fp16's rounding: a relative
error of at most ``2**-11`` per element for normal values.

Every tensor the codec makes is on its input's device: torch's ``ldexp`` with an integer
exponent runs one kernel (``_ldexp_int_exponent``) that refuses a CPU exponent beside a CUDA
tensor, so the exponent is made where the tensor is (:func:`_scaled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Encoded", "encode", "decode", "MODE_HALF", "MODE_FULL"]

MODE_HALF, MODE_FULL = 0, 1
_TOP_EXPONENT = 14


@dataclass(frozen=True)
class Encoded:
    payload: Tensor
    mode: int
    exponent: int


def encode(tensor: Tensor, *, underflow_tolerance: float = 1e-4) -> Encoded:
    """Compress ``tensor`` to fp16 with a power-of-two scaler, or keep it (see module doc)."""
    if tensor.dtype not in (torch.float32, torch.float64) or tensor.numel() == 0:
        return Encoded(tensor, MODE_FULL, 0)
    magnitude = tensor.detach().abs()
    largest = float(magnitude.max())
    if not math.isfinite(largest):
        return Encoded(tensor, MODE_FULL, 0)
    if largest == 0.0:
        return Encoded(torch.zeros_like(tensor, dtype=torch.float16), MODE_HALF, 0)
    exponent = math.ceil(math.log2(largest)) - _TOP_EXPONENT
    half = _scaled(tensor.detach(), -exponent).to(torch.float16)
    if not bool(torch.isfinite(half).all()):
        return Encoded(tensor, MODE_FULL, 0)
    flushed = int(((half == 0) & (magnitude != 0)).sum())
    if flushed > underflow_tolerance * int((magnitude != 0).sum()):
        return Encoded(tensor, MODE_FULL, 0)
    return Encoded(half, MODE_HALF, exponent)


def decode(encoded: Encoded, dtype: torch.dtype) -> Tensor:
    """Restore the sender's dtype (exact inverse of the scaling; fp16 rounding remains)."""
    if encoded.mode == MODE_FULL:
        return encoded.payload.to(dtype)
    return _scaled(encoded.payload.to(dtype), encoded.exponent).to(dtype)


def _scaled(tensor: Tensor, exponent: int) -> Tensor:
    """``tensor * 2**exponent``, exactly, with the exponent on ``tensor``'s device."""
    return torch.ldexp(tensor, torch.full((), exponent, dtype=torch.int32, device=tensor.device))
