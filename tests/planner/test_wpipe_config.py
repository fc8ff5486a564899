"""WPipe's Eq. 3: the space (B = b M w, M >= d, isomers), the search, the paper model by hand."""

from __future__ import annotations

import pytest

from pipeweave.planner import Topology
from pipeweave.planner.wpipe_config import (Estimate, PaperModel, WPipeConfig, configuration_space,
                                            wpipe_search)

# per sample: forward 1 s, backward 2 s, 10 bytes of activations, 1 byte over a boundary;
# 8 bytes of parameters, no optimizer state; two workers joined at 1 byte/s
MODEL = PaperModel(forward=1.0, backward=2.0, activation_bytes=10.0, boundary_bytes=1.0,
                   parameter_bytes=8.0)
PAIR = Topology.single(2, 1.0)


def key(config: WPipeConfig) -> tuple[bool, int, int, int, int]:
    return (config.recompute, config.depth, config.width, config.microbatches,
            config.microbatch_size)


def test_space_of_four_samples_on_two_workers() -> None:
    # B = 4: d=1, w=2 with M in {1, 2} (b = 2, 1); d=2, w=1 with M in {2, 4} (M=3: b=4/3);
    # each with and without recomputation, one isomer per ratio on two workers
    space = configuration_space(4, 2, topology=PAIR)
    assert sorted(key(c) for c in space) == sorted(
        (r, d, w, m, b) for r in (False, True)
        for d, w, m, b in [(1, 2, 1, 2), (1, 2, 2, 1), (2, 1, 2, 2), (2, 1, 4, 1)])
    assert all(c.global_batch == 4 and c.microbatches >= c.depth for c in space)


def test_paper_model_by_hand() -> None:
    # d=1, w=2, M=2, b=1, recomputing: compute 2*1*(2*1 + 2)/1 = 8; no p2p (one stage per
    # copy); all-reduce 4 (2-1)/2 * 8 / 1 = 16 -> 24 s. Memory (2*8 + 0)/1 + 1*10/2 = 21.
    config = next(c for c in configuration_space(4, 2, topology=PAIR)
                  if key(c) == (True, 1, 2, 2, 1))
    assert MODEL(config) == Estimate(24.0, 21.0)
    # d=2, w=1, M=4, b=1, no recomputation: compute 4*1*3/2 = 6; p2p 4 * 2(2*2-1) * 1*1/1 = 24;
    # no all-reduce -> 30 s. Memory 2*8/2 + 4*1*10/2 = 28.
    config = next(c for c in configuration_space(4, 2, topology=PAIR)
                  if key(c) == (False, 2, 1, 4, 1))
    assert MODEL(config) == Estimate(30.0, 28.0)


def test_search_by_hand_under_a_memory_bound() -> None:
    # every candidate by hand (iteration s, memory B):
    #   d1 w2 M1 b2: 22, 36 | recompute 24, 26      d2 w1 M2 b2: 30, 28 | recompute 32, 13
    #   d1 w2 M2 b1: 22, 36 | recompute 24, 21      d2 w1 M4 b1: 30, 28 | recompute 32, 10.5
    ranked = wpipe_search(configuration_space(4, 2, topology=PAIR), MODEL, memory_limit=25)
    assert [(key(s.config), s.estimate.iteration_time, s.estimate.peak_memory, s.fits)
            for s in ranked[:3]] == [
        ((True, 1, 2, 2, 1), 24.0, 21.0, True),
        ((True, 2, 1, 4, 1), 32.0, 10.5, True),   # ties at 32 s: the smaller memory first
        ((True, 2, 1, 2, 2), 32.0, 13.0, True),
    ]
    assert ranked[0].throughput == pytest.approx(4 / 24)
    assert not any(s.fits for s in ranked[3:])
    unbounded = wpipe_search(configuration_space(4, 2, topology=PAIR), MODEL)
    assert unbounded[0].estimate.iteration_time == 22.0 and not unbounded[0].config.recompute


def test_isomers_come_from_the_placements() -> None:
    cluster = Topology.parse("2x1e10,2x1e9")
    space = configuration_space(4, 4, topology=cluster, max_microbatches=2)
    two_by_two = {c.placement for c in space if c.depth == 2}
    assert two_by_two == {"pipeline-inner", "data-inner"}
    inner = next(c for c in space if c.depth == 2 and c.placement == "pipeline-inner")
    assert inner.p2p_bandwidth == (1e10,) and inner.allreduce_bandwidth == (1e9, 1e9)


def test_caller_estimates_and_mistakes() -> None:
    space = configuration_space(8, 2)
    fastest_deep = wpipe_search(space, lambda c: Estimate(1.0 / c.depth, 0.0))[0]
    assert fastest_deep.config.depth == 2
    with pytest.raises(ValueError, match="iteration time 0"):
        wpipe_search(space, lambda c: Estimate(0, 0))
    with pytest.raises(ValueError, match="make the product"):
        configuration_space(4, 3, topology=PAIR)
    with pytest.raises(ValueError, match="gpus must be an integer"):
        configuration_space(4, 0)
