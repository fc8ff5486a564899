"""A profile's block costs at another micro-batch size.

The profile times one micro-batch of ``profile.batch_size`` samples; a candidate with M
micro-batches of a batch of B samples runs micro-batches of ``b = B / M``. Tensor sizes that
grow with the samples (activation and output bytes, the input) scale by ``b /
profile.batch_size``; parameters, optimizer state and the optimizer step do not change.

Times do not scale linearly on a real device: a small micro-batch pays the same per-kernel
launch and Python costs as a large one. With profiles of the same model at several
micro-batch sizes (``pipeweave auto --model`` takes two: the default plan's and a quarter of
it) the model's total forward time ``T_F(b)`` and backward time ``T_B(b)`` are interpolated
piecewise-linearly between the measured sizes (extrapolated with the nearest segment, and
below the smallest size never faster than linear scaling from it), and every block's forward (backward, I,
W) is scaled by ``T_F(b) / T_F(b0)`` (``T_B``): the totals are robust where a single block's
timing is noisy. With one profile the times scale linearly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..profiler import Profile

__all__ = ["scaled_profile", "time_factor"]

_BYTES = ("output_bytes", "activation_bytes", "peak_memory_bytes", "tp_split_activation_bytes",
          "tp_split_output_bytes")


def time_factor(points: Sequence[tuple[int, float]], base: int, size: int) -> float:
    """``T(size) / T(base)`` for the measured ``(batch size, total time)`` points."""
    known = sorted(dict(points).items())
    value = dict(known)

    def total(b: float) -> float:
        if len(known) == 1:
            b0, t0 = known[0]
            return t0 * b / b0
        lo = max((k for k in known if k[0] <= b), default=known[0])
        pair = [k for k in known if k[0] > lo[0]][:1]
        (b1, t1), (b2, t2) = (known[-2], known[-1]) if not pair else (lo, pair[0])
        t = t1 + (t2 - t1) * (b - b1) / (b2 - b1)
        smallest, t_small = known[0]
        return max(t, t_small * b / smallest) if b < smallest else t

    reference = value.get(base, total(base))
    return total(size) / reference if reference > 0 else size / base


def scaled_profile(profile: Profile, microbatch_size: int,
                   others: Sequence[Profile] = ()) -> Profile:
    """``profile`` at ``microbatch_size`` samples per micro-batch (module docstring);
    ``others``: profiles of the same model at other micro-batch sizes."""
    base = profile.batch_size
    assert base is not None
    if microbatch_size == base:
        return profile
    every = [profile, *others]
    forward = time_factor([(p.batch_size or base, sum(p.forward)) for p in every], base,
                          microbatch_size)
    backward = time_factor([(p.batch_size or base, sum(p.backward)) for p in every], base,
                           microbatch_size)
    size = microbatch_size / base
    blocks = tuple(replace(b, forward=b.forward * forward, backward=b.backward * backward,
                           weight_grad=b.weight_grad * backward,
                           input_grad=b.input_grad * backward,
                           **{name: getattr(b, name) * size for name in _BYTES})
                   for b in profile.blocks)
    return replace(profile, blocks=blocks, batch_size=microbatch_size,
                   input_bytes=profile.input_bytes * size)
