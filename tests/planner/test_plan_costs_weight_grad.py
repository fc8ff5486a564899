"""plan_costs carries the profile's measured weight-gradient time (W) to the simulator."""

from __future__ import annotations

import pytest

from pipeweave.planner.evaluate import plan_costs
from pipeweave.profiler import BlockProfile, Profile


def test_measured_weight_grad_per_stage_and_half_the_backward_where_unknown() -> None:
    blocks = (BlockProfile("a", 1.0, 2.0, 8, 8, 8, weight_grad=0.5, input_grad=1.75),
              BlockProfile("b", 1.0, 4.0, 8, 8, 8),  # I, W unknown: 4 / 2 each
              BlockProfile("c", 1.0, 3.0, 8, 8, 8, weight_grad=2.5))  # I unknown: 3 - 2.5
    costs = plan_costs(Profile(blocks), [(0, 2), (2, 3)])
    table = costs.resolve(2)
    assert costs.weight_grad == pytest.approx([0.5 + 2.0, 2.5])
    assert table.backward == pytest.approx((6.0, 3.0))
    assert table.input_grad == pytest.approx((1.75 + 2.0, 0.5))  # a split that costs more: 6.25
