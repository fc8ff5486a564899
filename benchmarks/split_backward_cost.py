"""Benchmark: what splitting the backward costs on one stage (issue 15).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/split_backward_cost.py
        [--repeats 20] [--json-out benchmarks/results/split_backward_cost.json]

One stage of the zero-bubble benchmark's GPT (d 128, blocks 1..5 of 4 layers as sub-layer
blocks, T 64, 8 samples, one thread): the median time of one whole backward (``B``) against
its two halves run with :mod:`pipeweave.split_backward` (``I``: input gradient, ``W``: weight
gradients), each after the same forward. ``W`` is timed twice: as it runs (a linear's weight
gradient computed directly, :func:`~pipeweave.split_backward.linear_weight_gradient`) and with
that path switched off (``W_engine``: one autograd engine call per parameter holder), with the
engine calls each makes. ``--tiny`` shrinks the stage (d 32, T 8, 2 samples) so that host cost
per call dominates, as it does for a GPU's small kernels. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from pipeweave import split_backward
from pipeweave.models import build_model
from pipeweave.split_backward import input_gradient, recording, weight_gradient

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "split_backward_cost.json"


@contextmanager
def engine_only(on: bool) -> Iterator[None]:
    """With ``on``, every holder's ``W`` goes through the autograd engine (the old path)."""
    direct = split_backward.linear_weight_gradient
    if on:
        split_backward.linear_weight_gradient = lambda *_: False  # type: ignore[assignment]
    try:
        yield
    finally:
        split_backward.linear_weight_gradient = direct


@contextmanager
def counting(calls: list[int]) -> Iterator[None]:
    """Count ``torch.autograd.backward`` calls into ``calls``."""
    original = torch.autograd.backward

    def counted(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        original(*args, **kwargs)

    torch.autograd.backward = counted  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.autograd.backward = original


def timed(stage: nn.Module, x0: torch.Tensor, split: bool) -> tuple[float, float]:
    """Seconds of (B, 0) or (I, W) after one forward of ``x0``."""
    x = x0.clone().requires_grad_(True)
    if not split:
        out = stage(x)
        began = time.perf_counter()
        out.backward(torch.ones_like(out))
        return time.perf_counter() - began, 0.0
    with recording(stage) as recorded:
        out = stage(x)
    began = time.perf_counter()
    _, pending = input_gradient(stage, x, out, torch.ones_like(out), recorded)
    middle = time.perf_counter()
    weight_gradient(pending)
    return middle - began, time.perf_counter() - middle


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="d 32, T 8, 2 samples")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    d, t, rows = (32, 8, 2) if args.tiny else (128, 64, 8)
    spec = build_model("gpt-tiny", n_layers=4, d_model=d, n_heads=4, d_ff=4 * d, seq_len=t)
    stage = nn.Sequential(*spec.blocks[1:6])
    x0 = spec.blocks[0](torch.randint(0, 256, (rows, t))).detach()
    whole, halves, engine = [], [], []
    for run in range(args.repeats + 5):  # alternate; the first 5 of each warm up
        b, _ = timed(stage, x0, split=False)
        i, w = timed(stage, x0, split=True)
        with engine_only(True):
            _, w_engine = timed(stage, x0, split=True)
        if run >= 5:
            whole.append(b)
            halves.append((i, w))
            engine.append(w_engine)
    result = {"B_ms": 1e3 * statistics.median(whole),
              "I_ms": 1e3 * statistics.median(i for i, _ in halves),
              "W_ms": 1e3 * statistics.median(w for _, w in halves),
              "W_engine_ms": 1e3 * statistics.median(engine)}
    result["I_plus_W_over_B"] = (result["I_ms"] + result["W_ms"]) / result["B_ms"]
    for name, off in (("engine_calls_per_W", False), ("engine_calls_per_W_engine", True)):
        calls: list[int] = []
        with engine_only(off), counting(calls):
            timed(stage, x0, split=True)
        result[name] = float(len(calls))
    print(f"{'B (ms)':>8} {'I (ms)':>8} {'W (ms)':>8} {'W_engine':>9} {'(I+W)/B':>8} "
          f"{'calls/W':>8} {'calls/W_engine':>15}")
    print(f"{result['B_ms']:8.2f} {result['I_ms']:8.2f} {result['W_ms']:8.2f} "
          f"{result['W_engine_ms']:9.2f} {result['I_plus_W_over_B']:8.2f} "
          f"{result['engine_calls_per_W']:8.0f} {result['engine_calls_per_W_engine']:15.0f}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result

if __name__ == "__main__":
    main()
