"""Numeric precision of a run: which dtype the weights, the activations and the optimizer use.

Three precisions (``--precision``; docs/precision.md has the whole table and measurements)::

    precision    parameters, gradients,    forward/backward compute         activations between
                 optimizer state                                            stages
    full         the model's dtype         the model's dtype                the model's dtype
                 (--dtype float32/float64)
    bf16-mixed   float32 ("master")        torch.autocast(bfloat16) around  what autocast made
                                           every stage's forward and loss   (a float32 residual
                                                                            stream stays float32)
    bf16         bfloat16                  bfloat16                         bfloat16

fp16 is refused (:data:`REFUSED`): half precision's 5-bit exponent needs a loss scale that
every stage applies and a step that every rank skips together when any gradient overflowed.
pipeweave's asynchronous schedules update stages at different times, so there is no one step
to skip, and bfloat16 has float32's exponent range and needs no scaling at all.

This module is a leaf (torch only): the runtime's stages and the profiler share it, so the
profiler measures what the runtime will run.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import Tensor, nn

__all__ = ["PRECISIONS", "REFUSED", "check_precision", "compute", "cast_module", "cast_input",
           "parameter_dtype"]

PRECISIONS = ("full", "bf16-mixed", "bf16")
"""The precisions a run can use (module docstring); ``full`` is the default."""

_FP16_REASON = (
    "fp16 needs a loss scale shared by all stages and an update skipped on every rank at once "
    "when any gradient overflows, and pipeweave has no such scaler (asynchronous schedules "
    "update stages at different times, so there is no one update to skip); use --precision "
    "bf16-mixed (bfloat16 has float32's exponent range and needs no loss scale)")
REFUSED = {"fp16": _FP16_REASON, "fp16-mixed": _FP16_REASON, "float16": _FP16_REASON}
"""Precisions asked for often enough to deserve their own answer: why not, and what instead."""


def check_precision(precision: str, *, dtype: torch.dtype = torch.float32,
                    apc: bool = False) -> None:
    """Raise ``ValueError`` (one line: the value, the rule, the fix) for a precision this run
    cannot honour with the model's ``dtype`` and ``apc``."""
    if precision in REFUSED:
        raise ValueError(f"--precision {precision} is not supported: {REFUSED[precision]}")
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r} is unknown; choose one of "
                         f"{', '.join(PRECISIONS)}")
    if precision == "full":
        return
    if dtype != torch.float32:
        what = ("keeps float32 master weights (autocast leaves float64 alone, so nothing "
                "would run in bfloat16)" if precision == "bf16-mixed"
                else "stores the parameters in bfloat16")
        raise ValueError(f"--precision {precision} {what}, but the model is "
                         f"{str(dtype).removeprefix('torch.')}; build it in float32 (--dtype "
                         f"float32) or use --precision full")
    if apc and precision == "bf16":
        raise ValueError("--apc with --precision bf16 would do nothing: activations and "
                         "gradients already cross stages as bfloat16 (2 bytes) and APC "
                         "compresses only float32/float64 tensors; drop --apc")


def compute(precision: str, device_type: str) -> ContextManager[object]:
    """The context a stage's forward and loss run in: ``torch.autocast`` to bfloat16 for
    ``bf16-mixed`` on ``device_type`` ("cpu", "cuda"), else nothing."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def parameter_dtype(precision: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype parameters (and gradients, optimizer state) are stored in."""
    return torch.bfloat16 if precision == "bf16" else dtype


def cast_module(module: nn.Module, precision: str) -> nn.Module:
    """``module`` with its floating parameters and buffers in bfloat16 for ``bf16`` (in
    place, as ``Module.to``); unchanged otherwise."""
    return module.to(torch.bfloat16) if precision == "bf16" else module


def cast_input(tensor: Tensor, precision: str) -> Tensor:
    """A model input or target as the first/last stage consumes it: floating tensors in
    bfloat16 for ``bf16`` (token ids and labels stay integers)."""
    if precision == "bf16" and tensor.is_floating_point() and tensor.dtype != torch.bfloat16:
        return tensor.to(torch.bfloat16)
    return tensor
