"""The runtime's message latency in the plan's costs (hand-derived), and how long a timed
calibration run lasts. The latency itself is fitted with the all-reduce's cost from two plans'
runs: tests/auto/test_calibration_runs.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.profiler.runtime_costs import RuntimeCosts


def test_message_latency_is_added_to_transfers_and_ring_steps() -> None:
    """Hand-derived: every transfer's latency + L, each replicated stage's all-reduce + 2 (r-1) L."""
    profile = small_profile(3, blocks=4)
    slow = replace(profile, runtime=RuntimeCosts(message_latency=2e-3))
    network = Network(bandwidth=1e9, latency=1e-5)
    plain = plan_costs(profile, ((0, 2), (2, 4)), network, replicas=(1, 3))
    costs = plan_costs(slow, ((0, 2), (2, 4)), network, replicas=(1, 3))
    assert costs.latency == pytest.approx(1e-5 + 2e-3)
    assert costs.all_reduce[0] == pytest.approx(plain.all_reduce[0])
    assert costs.all_reduce[1] == pytest.approx(plain.all_reduce[1] + 2 * 2 * 2e-3)
    assert costs.forward == plain.forward and costs.backward == plain.backward


def test_calibration_runs_last_about_a_second() -> None:
    from pipeweave.measure import TIMED_SECONDS, timed_steps

    assert TIMED_SECONDS == 1.0
    assert timed_steps(0.3) == 6            # at least 6 (a slow model: 1.5 s timed)
    assert timed_steps(0.01) == 101         # 100 timed iterations of 10 ms, and the warm-up
    assert timed_steps(1e-6) == 200         # at most 200
    assert timed_steps(0.0) == 6
