"""The runtime's fixed costs per action: the data type, its JSON, the fit, how the planner
prices a stage with them, and a real measurement on a small model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.profiler import BlockProfile, LinkProfile, Profile
from pipeweave.profiler.runtime_costs import RuntimeCosts
from pipeweave.measure import fit_runtime_costs

US = 1e-6


def _profile(runtime: RuntimeCosts | None = None) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", forward=(i + 1) * 100 * US, backward=(i + 1) * 200 * US,
                                output_bytes=1000.0, activation_bytes=10.0, parameter_bytes=8.0,
                                update=50 * US, weight_grad=(i + 1) * 80 * US,
                                input_grad=(i + 1) * 130 * US)
                   for i in range(4))
    return Profile(blocks, model="toy", batch_size=2, device="cpu",
                   link=LinkProfile(1e9, 0.0), runtime=runtime)


COSTS = RuntimeCosts(per_action={"forward": 40 * US, "backward": 60 * US, "update": 30 * US,
                                 "input_grad": 50 * US, "weight_grad": 20 * US},
                     per_block={"forward": -5 * US, "backward": -70 * US, "update": -45 * US,
                                "input_grad": -30 * US, "weight_grad": -10 * US},
                     per_message=25 * US)


def test_plan_costs_add_the_runtime_per_action_block_and_message() -> None:
    """Hand-derived: stages (0,3) and (3,4); blocks' forwards 100..400 us, backwards 200..800."""
    costs = plan_costs(_profile(COSTS), ((0, 3), (3, 4)), Network(bandwidth=1e9))
    plain = plan_costs(_profile(), ((0, 3), (3, 4)), Network(bandwidth=1e9))
    # stage 0: 3 blocks, sends its output forward; stage 1: 1 block, sends its gradient back
    assert costs.forward[0] == pytest.approx((100 + 200 + 300 + 40 - 5 * 2 + 25) * US)
    assert costs.forward[1] == pytest.approx((400 + 40) * US)
    assert costs.backward[0] == pytest.approx((200 + 400 + 600 + 60 - 70 * 2) * US)
    assert costs.backward[1] == pytest.approx((800 + 60 + 25) * US)
    assert costs.update[0] == pytest.approx((150 + 30 - 45 * 2) * US)
    assert costs.update[1] == pytest.approx((50 + 30) * US)
    assert costs.input_grad[0] == pytest.approx((130 + 260 + 390 + 50 - 30 * 2) * US)
    assert costs.input_grad[1] == pytest.approx((520 + 50 + 25) * US)
    assert costs.weight_grad[0] == pytest.approx((80 + 160 + 240 + 20 - 10 * 2) * US)
    assert costs.weight_grad[1] == pytest.approx((320 + 20) * US)
    # what the runtime does not touch stays as it was
    assert costs.comm == plain.comm and costs.activation_bytes == plain.activation_bytes


def test_a_stage_never_costs_less_than_a_tenth_of_its_blocks() -> None:
    greedy = RuntimeCosts(per_action={"forward": 0.0}, per_block={"forward": -1.0})
    costs = plan_costs(_profile(greedy), ((0, 4),))
    assert costs.forward[0] == pytest.approx(1000 * US / 10)


def test_fit_recovers_a_line_through_exact_points() -> None:
    samples = [(kind, k, a + b * (k - 1)) for kind, a, b in
               (("forward", 40 * US, -5 * US), ("update", 30 * US, -45 * US))
               for k in (1, 1, 2, 3, 5)]
    fitted = fit_runtime_costs(samples, messages=[10 * US, 30 * US, 20 * US])
    assert fitted.per_action["forward"] == pytest.approx(40 * US)
    assert fitted.per_block["forward"] == pytest.approx(-5 * US)
    assert fitted.per_action["update"] == pytest.approx(30 * US)
    assert fitted.per_block["update"] == pytest.approx(-45 * US)
    assert fitted.per_message == pytest.approx(20 * US)
    one_size = fit_runtime_costs([("backward", 1, 7 * US), ("backward", 1, 9 * US)])
    assert one_size.per_action["backward"] == pytest.approx(8 * US)
    assert one_size.per_block["backward"] == 0.0


def test_json_round_trip_and_old_profiles_load(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _profile(COSTS).save(path)
    loaded = Profile.load(path)
    assert loaded.runtime == COSTS
    old = json.loads(path.read_text())
    del old["runtime"]
    path.write_text(json.dumps(old))
    assert Profile.load(path).runtime is None


@pytest.mark.parametrize("bad, message", [
    ({"per_action": {"forwards": 1e-5}}, "unknown kinds"),
    ({"per_block": {"forward": float("nan")}}, "finite"),
    ({"per_message": -1.0}, ">= 0"),
])
def test_bad_runtime_costs_are_refused(tmp_path: Path, bad: dict[str, object],
                                       message: str) -> None:
    data = _profile().to_json()
    data["runtime"] = bad
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        Profile.load(path)


@pytest.mark.timeout(300)
def test_measured_on_a_real_model() -> None:
    """The runtime really runs: every kind of action is measured, the numbers are finite, and
    one action of a one-block stage costs a few milliseconds at most beyond its block."""
    from pipeweave.profiler.measure import profile_builtin
    from pipeweave.measure import measure_runtime_costs

    profile = profile_builtin("mlp", batch_size=4, warmup=1, repeats=3, threads=1)
    said: list[str] = []
    costs = measure_runtime_costs(profile, model="mlp", iterations=2, say=said.append)
    assert set(costs.per_action) == {"forward", "backward", "input_grad", "weight_grad", "update"}
    assert all(abs(v) < 0.05 for v in costs.per_action.values())
    assert 0 <= costs.per_message < 0.05
    assert costs.notes["runs"] == 4 and len(said) == 4
    with pytest.raises(ValueError, match="blocks"):
        measure_runtime_costs(profile, model="gpt-tiny")


def test_the_runs_use_the_models_own_data_after_its_overrides() -> None:
    """A sequence model's runs take its overridden seq_len (the profile was measured with it);
    an image model's have none; an explicit one wins."""
    from pipeweave.runtime import BuiltinModel

    assert BuiltinModel("gpt-tiny", overrides={"seq_len": 16}).data(8).seq_len == 16
    assert BuiltinModel("gpt-tiny").data(8, seq_len=12).seq_len == 12
    image = BuiltinModel("cnn").data(8, seq_len=12)
    assert image.seq_len is None and image.batch_size == 8


def test_the_allreduce_costs_round_trip_and_bad_values_are_refused() -> None:
    import pytest

    from pipeweave.profiler.runtime_costs import RuntimeCosts

    costs = RuntimeCosts(allreduce_latency=2e-3, allreduce_bandwidth=3.5e8)
    back = RuntimeCosts.from_json(costs.to_json())
    assert back == costs and back.allreduce_bandwidth == 3.5e8
    assert RuntimeCosts.from_json({}).allreduce_bandwidth is None  # profiles written before
    with pytest.raises(ValueError, match="allreduce_latency must be a finite number"):
        RuntimeCosts(allreduce_latency=-1.0)
    with pytest.raises(ValueError, match="allreduce_bandwidth must be a finite number"):
        RuntimeCosts(allreduce_bandwidth=0.0)
    assert costs.all_reduce(1e6, 1, 0.5) == 0.0
    assert costs.all_reduce(1e6, 3, 1e-4) == pytest.approx(2e-3 + 2e6 / 3.5e8)
    assert costs.all_reduce(1e6, 3, 1.0) == pytest.approx(2e-3 + 1.0)  # the ring's floor
