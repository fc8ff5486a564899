"""A tensor-parallel stage as one of its processes sees it (``planner/tp_costs.py``): split
blocks compute ``1/T`` and pay the plan's activation all-reduces (ring, hand-computed here),
hold ``1/T`` of their split parameters, optimizer state and split activations; replicated
blocks are unchanged; the simulator's costs and the memory model read the same view."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipeweave.planner import Plan
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.memory import predicted_state
from pipeweave.planner.tp_costs import ring_allreduce_time, tp_profile
from pipeweave.profiler import BlockProfile, Profile

MB = 1e6


def _profile() -> Profile:
    embed = BlockProfile("embed", forward=1.0, backward=2.0, output_bytes=4 * MB,
                         activation_bytes=1 * MB, parameter_bytes=3 * MB,
                         optimizer_bytes=6 * MB)
    layer = BlockProfile("layer", forward=8.0, backward=16.0, output_bytes=4 * MB,
                         activation_bytes=20 * MB, parameter_bytes=10 * MB,
                         optimizer_bytes=20 * MB, weight_grad=6.0, input_grad=12.0,
                         tp_split_parameter_bytes=9 * MB, tp_split_activation_bytes=16 * MB,
                         tp_forward_reduces=2, tp_backward_reduces=2, pending_bytes=12 * MB,
                         tp_split_output_bytes=10 * MB)
    return Profile(blocks=(embed, layer, replace(layer, name="layer2")), model="hand",
                   batch_size=4)


def test_ring_all_reduce_by_hand() -> None:
    # 4 (T-1) |a| / (T B) + 2 (T-1) latency: T=4, 8 MB at 1 GB/s, 1 ms a message
    assert ring_allreduce_time(8 * MB, 4, 1e9, 1e-3) == pytest.approx(
        4 * 3 * 8e6 / (4 * 1e9) + 6e-3)
    assert ring_allreduce_time(8 * MB, 1, 1e9, 1e-3) == 0.0
    assert ring_allreduce_time(8 * MB, 2, math.inf) == 0.0


def test_a_split_block_by_hand() -> None:
    bandwidth, latency = 2e9, 1e-4
    view = tp_profile(_profile(), 2, bandwidth=bandwidth, latency=latency)
    embed, layer = view.blocks[0], view.blocks[1]
    assert embed == _profile().blocks[0]  # replicated: computed whole on every process
    reduce = 4 * 1 * 4e6 / (2 * 2e9) + 2 * 1 * 1e-4  # one all-reduce of the 4 MB output
    assert layer.forward == pytest.approx(8.0 / 2 + 2 * reduce)
    assert layer.backward == pytest.approx(16.0 / 2 + 2 * reduce)
    assert layer.input_grad == pytest.approx(12.0 / 2 + 2 * reduce)
    assert layer.weight_grad == pytest.approx(6.0 / 2)
    assert layer.parameter_bytes == pytest.approx(1 * MB + 4.5 * MB)
    assert layer.optimizer_bytes == pytest.approx(20 * MB * 5.5 / 10)
    assert layer.activation_bytes == pytest.approx(4 * MB + 8 * MB)
    assert layer.output_bytes == 4 * MB  # stage boundaries stay whole
    # a split backward's pending output gradients: the column-wise outputs' are split
    assert layer.pending_bytes == pytest.approx(12 * MB - 10 * MB / 2)
    assert view.metadata["tp"] == 2
    assert tp_profile(view, 2) is view  # already the view: not split twice
    with pytest.raises(ValueError, match="already one of 2 tensor-parallel"):
        tp_profile(view, 4)
    assert tp_profile(_profile(), 1) == _profile()


def test_simulator_costs_read_the_view() -> None:
    profile = _profile()
    bounds = [(0, 2), (2, 3)]
    network = Network(bandwidth=1e9, tp_bandwidth=2e9)
    split = plan_costs(profile, bounds, network, tp=2)
    view = plan_costs(tp_profile(profile, 2, bandwidth=2e9), bounds, network)
    assert split == view
    reduce = ring_allreduce_time(4 * MB, 2, 2e9)
    assert split.forward[0] == pytest.approx(1.0 + 8.0 / 2 + 2 * reduce)
    whole = plan_costs(profile, bounds, network)
    assert whole.forward[0] == pytest.approx(9.0)
    assert split.comm == whole.comm


def test_memory_model_holds_the_split_share() -> None:
    profile = _profile()
    whole = Plan(num_blocks=3, stages=((0, 2), (2, 3)), microbatches=2)
    split = Plan(num_blocks=3, stages=((0, 2), (2, 3)), microbatches=2, tp=2)
    a, b = (predicted_state(profile, plan, optimizer="adam") for plan in (whole, split))
    # stage 0: embed (3 MB, replicated) + layer (1 whole + 9 split): 13 MB -> 3 + 1 + 4.5
    assert a[0].parameters == pytest.approx(13 * MB)
    assert b[0].parameters == pytest.approx(8.5 * MB)
    assert b[0].gradients == pytest.approx(8.5 * MB)
    assert b[1].parameters == pytest.approx(5.5 * MB)
