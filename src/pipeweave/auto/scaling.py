"""A profile's block costs at another micro-batch size.

The profile times one micro-batch of ``profile.batch_size`` samples; a candidate with M
micro-batches of a batch of B samples runs micro-batches of ``b = B / M``. Times and tensor
sizes that grow with the samples (forward, backward and its two halves, activation and output
bytes, the input) are scaled by ``b / profile.batch_size``; what does not (parameters,
optimizer state, the optimizer step) is kept. Linear scaling ignores the fixed per-kernel
cost that makes small micro-batches less efficient on a real device; the predicted-against-
measured check of ``pipeweave auto --run`` shows how much that matters on a given machine.
"""

from __future__ import annotations

from dataclasses import replace

from ..profiler import Profile

__all__ = ["scaled_profile"]

_PER_SAMPLE = ("forward", "backward", "weight_grad", "input_grad", "output_bytes",
               "activation_bytes", "peak_memory_bytes")


def scaled_profile(profile: Profile, microbatch_size: int) -> Profile:
    """``profile`` with its per-sample costs scaled to ``microbatch_size`` samples."""
    assert profile.batch_size is not None
    if microbatch_size == profile.batch_size:
        return profile
    factor = microbatch_size / profile.batch_size
    blocks = tuple(replace(b, **{name: getattr(b, name) * factor for name in _PER_SAMPLE})
                   for b in profile.blocks)
    return replace(profile, blocks=blocks, batch_size=microbatch_size,
                   input_bytes=profile.input_bytes * factor)
