"""A tied parameter split over stages: the copies' gradient sum is priced on the holders'
updates, and the memory model counts a copy per holding stage (once on a stage holding both
uses). Expected numbers are written out from the profile by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.plan import Plan
from pipeweave.profiler import BlockProfile, Profile, TieProfile

TIED = 3e6  # bytes of the shared parameter (in both holders' parameter_bytes)
UPDATE = 0.25


def _profile(tied: bool = True) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", forward=1.0, backward=2.0, output_bytes=1e3,
                                activation_bytes=1e4, parameter_bytes=(TIED if i in (0, 3)
                                                                       else 1e6),
                                update=UPDATE) for i in range(4))
    return Profile(blocks, batch_size=1, ties=(TieProfile((0, 3), TIED),) if tied else ())


ONE_EACH = ((0, 1), (1, 2), (2, 3), (3, 4))


def test_the_sum_is_one_message_over_the_slowest_link_between_the_holders() -> None:
    network = Network(bandwidth=[4e9, 1e9, 2e9], latency=1e-4)
    update = plan_costs(_profile(), ONE_EACH, network).resolve(4).update
    message = 1e-4 + TIED / 1e9
    assert update == pytest.approx((UPDATE + message, UPDATE, UPDATE, UPDATE + message))
    untied = plan_costs(_profile(tied=False), ONE_EACH, network).resolve(4).update
    assert untied == pytest.approx((UPDATE,) * 4)


def test_holders_on_one_rank_sum_locally() -> None:
    network = Network(bandwidth=1e9, latency=1e-4)
    v_shape = ((0,), (1,), (1,), (0,))  # a V: stages 0 and 3 on rank 0
    update = plan_costs(_profile(), ONE_EACH, network, stage_ranks=v_shape).resolve(4).update
    assert update == pytest.approx((UPDATE,) * 4)
    whole = plan_costs(_profile(), ((0, 4),), network).resolve(1).update
    assert whole == pytest.approx((4 * UPDATE,))


def test_a_stage_holding_both_uses_all_reduces_the_parameter_once() -> None:
    network = Network(bandwidth=1e9)
    reduce = plan_costs(_profile(), ((0, 4),), network, replicas=(2,)).resolve(1).all_reduce
    held = 2 * 1e6 + TIED  # the tie once
    assert reduce == pytest.approx((4 * (2 - 1) * held / (2 * 1e9),))


def test_memory_counts_a_copy_per_holding_stage_and_one_on_a_shared_stage() -> None:
    profile = _profile()
    one = predicted_memory(profile, Plan.uniform(4, 1, microbatches=2), batch_size=2,
                           optimizer="sgd")
    assert one[0].parameters == pytest.approx(2 * 1e6 + TIED)
    assert one[0].gradients == pytest.approx(2 * 1e6 + TIED)
    two = predicted_memory(profile, Plan.uniform(4, 2, microbatches=2), batch_size=2,
                           optimizer="adam")
    assert [r.parameters for r in two] == pytest.approx([TIED + 1e6, 1e6 + TIED])
    assert [r.optimizer_state for r in two] == pytest.approx([2 * (TIED + 1e6)] * 2)
    measured = replace(profile, metadata={"optimizer": "adam"}, blocks=tuple(
        replace(b, optimizer_bytes=2 * b.parameter_bytes) for b in profile.blocks))
    shared = predicted_memory(measured, Plan.uniform(4, 1, microbatches=2), batch_size=2,
                              optimizer="adam")
    assert shared[0].optimizer_state == pytest.approx(2 * (2 * 1e6 + TIED))


def test_plan_refuses_an_asynchronous_schedule_over_a_split_tie(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pipeweave plan` says in one line what `pipeweave train` would refuse, and writes nothing."""
    from pipeweave.cli.main import main

    path, out = tmp_path / "tied.json", tmp_path / "plan.json"
    _profile().save(path)
    assert main(["plan", "--profile", str(path), "--ranks", "2", "--method", "uniform",
                 "--schedule", "pipedream", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pipeweave train refuses it" in err
    assert "schedule 'pipedream'" in err and not out.exists()
    assert main(["plan", "--profile", str(path), "--ranks", "2", "--method", "uniform",
                 "--schedule", "1f1b", "--out", str(out)]) == 0
    assert Plan.load(out).schedule == "1f1b"
