"""Profiles for the planner tests: a synthetic GPT at sub-layer granularity, random chains."""

from __future__ import annotations

import random
from pathlib import Path

from pipeweave.profiler import BlockProfile, LinkProfile, Profile

PROFILES = Path("/work/shared/reference/pipedream-profiles")


def gpt_profile(layers: int, *, d: int = 1024, seq: int = 1024, vocab: int = 50257, batch: int = 4,
                flops: float = 1e14, bandwidth: float = 1e10) -> Profile:
    """A GPT-2-like decoder from its multiply-accumulate counts (nanoGPT's cost formulas).

    Per token: attention block ``4 d^2`` (qkv + projection) + ``2 T d`` (scores and mixing),
    FFN block ``8 d^2``, head ``d V``; forward time ``2 MACs tokens / flops``, backward twice
    that. Outputs are ``[B, T, d]`` fp16 activations.
    """
    tokens = batch * seq

    def block(name: str, macs: float, params: float, out: float = tokens * d * 2) -> BlockProfile:
        forward = 2 * macs * tokens / flops
        return BlockProfile(name, forward, 2 * forward, out, 4 * out, 2 * params, 8 * params)

    blocks = [block("embed", 4 * d, (vocab + seq) * d)]
    for i in range(layers):
        blocks.append(block(f"layer{i}.attn", 4 * d * d + 2 * seq * d, 4 * d * d))
        blocks.append(block(f"layer{i}.ffn", 8 * d * d, 8 * d * d))
    blocks.append(block("head", d * vocab, d * vocab, tokens * vocab * 2))
    return Profile(tuple(blocks), model=f"gpt-{layers}l", batch_size=batch, device="synthetic",
                   source="synthetic", link=LinkProfile(bandwidth, 1e-5))


def random_profile(rng: random.Random, blocks: int) -> Profile:
    """Blocks with random times, parameters and activations (some zero, as ReLU layers are)."""
    return Profile(tuple(
        BlockProfile(f"b{i}", rng.uniform(0.1, 2), rng.uniform(0.1, 4), rng.choice([0, 1, 5, 20]) * 1e6,
                     rng.uniform(0, 50) * 1e6, rng.choice([0, 0.5, 3, 30]) * 1e6,
                     rng.uniform(0, 60) * 1e6)
        for i in range(blocks)
    ), model="random", source="synthetic")
