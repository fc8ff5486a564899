"""Small synthetic profiles for the auto tests (no link: transfers and all-reduces are free,
so a hand-written oracle needs only the compute times)."""

from __future__ import annotations

import random

from pipeweave.profiler import BlockProfile, LinkProfile, Profile


def small_profile(seed: int, blocks: int = 6, *, batch_size: int = 2,
                  link: LinkProfile | None = None) -> Profile:
    """Blocks with random forward/backward times (ms) and sizes (MB), one micro-batch of
    ``batch_size`` samples."""
    rng = random.Random(seed)
    return Profile(tuple(
        BlockProfile(f"b{i}", forward=rng.uniform(1e-3, 4e-3), backward=rng.uniform(2e-3, 8e-3),
                     output_bytes=rng.uniform(0.1, 1) * 1e6,
                     activation_bytes=rng.uniform(0.5, 4) * 1e6,
                     parameter_bytes=rng.uniform(0.1, 3) * 1e6,
                     optimizer_bytes=0.0, update=rng.uniform(0, 5e-4))
        for i in range(blocks)
    ), model="toy", batch_size=batch_size, device="synthetic", source="synthetic", link=link)
