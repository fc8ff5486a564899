"""A profile's block costs at another micro-batch size.

The profile times one micro-batch of ``profile.batch_size`` samples; a candidate with M
micro-batches of a batch of B samples runs micro-batches of ``b = B / M``. Tensor sizes that
grow with the samples (activation and output bytes, the input) scale by ``b /
profile.batch_size``; parameters, optimizer state and the optimizer step do not change.

Times do not scale linearly on a real device: every call pays a fixed cost (kernel launches,
Python, autograd's bookkeeping) beside its per-sample work. Measured 2026-11-27 on this
2-core machine, one thread, load about 2.6 (each block alone, median of 7, ms at 1 / 2 / 4 /
8 samples): a gpt-tiny attention block's forward 0.29 / 0.33 / 0.47 / 1.12 (``a`` about
0.2 ms a call, ``b`` about 0.06 ms a sample up to 4, steeper above), the whole forward 2.3 /
2.7 / 3.8 / 6.9; cnn's convolutions close to proportional (``a`` near 0), its fc and head
blocks flat at 0.04-0.06 ms (all fixed cost), the whole forward 0.29 / 0.55 / 0.89 / 1.04 (flat
above 4). So each block's time is modelled as ``a + b m`` for ``m`` samples, a line through
the two profiled sizes around ``m`` (:func:`fit_line`; piecewise over three or more sizes,
the curve being neither linear nor one line), its forward and backward separately, its I and
W scaled with its backward. Outside the profiled sizes the nearest segment is extended,
never below proportional scaling from the smallest size (``a >= 0``) nor, above the
largest, below the largest's time. From profiles at 1 and 4 samples the old whole-model
line put cnn's forward at 8 samples 61 % high and gpt-tiny's 16 % low, and at 2 samples
12 % low and 5 % high, so ``pipeweave auto --model`` profiles every micro-batch size its
one-pipeline candidates use (:func:`pipeweave.measure.auto_microbatch_sizes`: 8, 4, 2 and
1 by default) and neither interpolates nor extrapolates. With one profile the times scale
proportionally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..profiler import BlockProfile, Profile

__all__ = ["block_time", "fit_line", "scaled_profile"]

_BYTES = ("output_bytes", "activation_bytes", "peak_memory_bytes", "tp_split_activation_bytes",
          "tp_split_output_bytes")


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``time = a + b m`` through ``(m, time)`` points
    of two or more sizes; one size: ``(0, time / m)`` (proportional)."""
    sizes = {m for m, _ in points}
    if len(sizes) < 2:
        m, t = points[0]
        return 0.0, t / m
    n = len(points)
    mean_m = sum(m for m, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    slope = sum((m - mean_m) * (t - mean_t) for m, t in points) \
        / sum((m - mean_m) ** 2 for m, _ in points)
    return mean_t - slope * mean_m, slope


def block_time(points: Sequence[tuple[int, float]], size: float) -> float:
    """One block's time at ``size`` samples from its profiled ``(samples, time)`` points
    (module docstring): the line through the two sizes around ``size``, the nearest two
    outside; at least proportional to the smallest size below it, at least the largest's
    time above it."""
    known = sorted(dict(points).items())
    if len(known) == 1:
        return known[0][1] * size / known[0][0]
    above = next((i for i, (m, _) in enumerate(known) if m >= size), len(known) - 1)
    pair = known[max(0, above - 1):max(0, above - 1) + 2]
    a, b = fit_line(pair)
    (smallest, t_small), (largest, t_large) = known[0], known[-1]
    floor = t_small * size / smallest if size < smallest else t_large if size > largest else 0.0
    return max(a + b * size, floor)


def _scaled_block(block: BlockProfile, others: Sequence[tuple[int, BlockProfile]],
                  base: int, size: int) -> BlockProfile:
    """``block`` (profiled at ``base`` samples) at ``size``, from itself and ``others``."""
    every = [(base, block), *others]
    forward = block_time([(m, b.forward) for m, b in every], size)
    backward = block_time([(m, b.backward) for m, b in every], size)
    ratio = backward / block.backward if block.backward > 0 else size / base
    return replace(block, forward=forward, backward=backward,
                   weight_grad=block.weight_grad * ratio, input_grad=block.input_grad * ratio,
                   **{name: getattr(block, name) * size / base for name in _BYTES})


def scaled_profile(profile: Profile, microbatch_size: int,
                   others: Sequence[Profile] = ()) -> Profile:
    """``profile`` at ``microbatch_size`` samples per micro-batch (module docstring);
    ``others``: profiles of the same model at other micro-batch sizes."""
    base = profile.batch_size
    assert base is not None
    if microbatch_size == base:
        return profile
    sized = [(p.batch_size or base, p) for p in others if (p.batch_size or base) != base]
    blocks = tuple(_scaled_block(block, [(m, p.blocks[i]) for m, p in sized], base,
                                 microbatch_size)
                   for i, block in enumerate(profile.blocks))
    return replace(profile, blocks=blocks, batch_size=microbatch_size,
                   input_bytes=profile.input_bytes * microbatch_size / base)
