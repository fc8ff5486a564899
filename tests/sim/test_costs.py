"""Costs: expansion per stage / boundary, bandwidth-derived transfers, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeweave.sim import Costs


def test_defaults_are_autopipes_units() -> None:
    table = Costs.uniform().resolve(3)
    assert table.forward == (1.0, 1.0, 1.0)
    assert table.backward == (2.0, 2.0, 2.0)
    assert table.transfer == (0.0, 0.0)
    assert table.activation_bytes == (1.0, 1.0, 1.0)
    assert table.update == table.all_reduce == table.average == (0.0, 0.0, 0.0)


def test_weight_gradient_defaults_to_half_the_backward() -> None:
    """B = I + W: the defaults F=1, B=2 are the zero-bubble paper's F = I = W = 1."""
    table = Costs().resolve(2)
    assert table.weight_grad == (1.0, 1.0) and table.input_grad == (1.0, 1.0)
    table = Costs(backward=[2, 3, 4], weight_grad=[0.5, 1, 4]).resolve(3)
    assert table.weight_grad == (0.5, 1.0, 4.0) and table.input_grad == (1.5, 2.0, 0.0)
    assert Costs(backward=[2, 6]).resolve(2).weight_grad == (1.0, 3.0)


def test_per_stage_and_per_boundary_values() -> None:
    table = Costs(forward=[1, 2, 3], backward=(2, 4, 6), comm=[0.5, 0.25], update=0.1).resolve(3)
    assert table.forward == (1.0, 2.0, 3.0)
    assert table.backward == (2.0, 4.0, 6.0)
    assert table.comm(0) == 0.5 and table.comm(1) == 0.25
    assert table.comm(0, half=True) == 0.25  # a Slicer half sends half the bytes
    assert table.update == (0.1, 0.1, 0.1)


def test_transfer_from_bytes_bandwidth_and_latency() -> None:
    table = Costs(boundary_bytes=[4e6, 8e6], bandwidth=2e6, latency=0.5).resolve(3)
    assert table.transfer == (2.0, 4.0)
    assert table.comm(1) == 4.5
    assert table.comm(1, half=True) == 2.5  # latency is paid in full


@pytest.mark.parametrize(
    ("kwargs", "stages", "message"),
    [
        ({"forward": [1, 2]}, 3, "forward has 2 values [1.0, 2.0] but the schedule has 3 stages"),
        ({"comm": [1, 1, 1]}, 3, "comm has 3 values"),
        ({"backward": -1}, 2, "backward must be a finite number >= 0, got -1"),
        ({"forward": [1, float("nan")]}, 2, "forward[1] must be a finite number"),
        ({"forward": "fast"}, 2, "forward must be a number or a sequence of numbers, got 'fast'"),
        ({"forward": []}, 2, "forward is an empty sequence"),
        ({"boundary_bytes": 10}, 2, "give both"),
        ({"bandwidth": 0, "boundary_bytes": 1}, 2, "bandwidth must be > 0"),
        ({"comm": 1, "boundary_bytes": 1, "bandwidth": 1}, 2, "give only one of them"),
        ({}, 0, "stages must be >= 1, got 0"),
        ({"backward": 2, "weight_grad": 3}, 2,
         "weight_grad 3 exceeds backward 2 on every stage: the weight gradient"),
        ({"backward": [2, 2], "weight_grad": [1, 2.5]}, 2, "weight_grad 2.5 exceeds backward 2 on stage 1"),
        ({"backward": [2, 2, 2], "weight_grad": [1, 3]}, 3, "weight_grad has 2 values"),
        ({"weight_grad": -1}, 2, "weight_grad must be a finite number >= 0"),
    ],
)
def test_errors_name_the_bad_value(kwargs: dict, stages: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Costs(**kwargs).resolve(stages)


def test_to_json_is_plain() -> None:
    data = Costs(forward=[1, 2], comm=0.5).to_json()
    assert data["forward"] == [1.0, 2.0]
    assert data["comm"] == 0.5
    assert data["bandwidth"] is None
    assert data["weight_grad"] == 1.0  # the value simulated: half the default backward
    assert Costs(backward=[2, 4]).to_json()["weight_grad"] == [1.0, 2.0]
    assert Costs(**Costs(backward=[2, 4]).to_json()).resolve(2) == Costs(backward=[2, 4]).resolve(2)


def _normalised_one_by_one(name: str, values: list[object]) -> tuple[float, ...]:
    """The per-value check ``_normalise`` runs where its all-floats path does not apply."""
    from pipeweave.sim.costs import check_number
    return tuple(check_number(f"{name}[{i}]", v) for i, v in enumerate(values))


@pytest.mark.parametrize("values", [
    [1.0, 2.5, 0.0], [0.0, -0.0, 3.0], (1e-300, 1e300), [1, 2.0], [np.float64(1.5), 2.0],
    [1.0, float("nan")], [1.0, math.inf], [1.0, -1e-9], [True, 1.0], [1.0, "2"],
    [2.0 ** k for k in range(-60, 60)],
])
def test_sequences_normalised_as_checked_one_by_one(values: list[object]) -> None:
    from pipeweave.sim.costs import _normalise
    try:
        expected: object = _normalised_one_by_one("forward", values)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            _normalise("forward", values)
        assert str(raised.value) == str(error)
        return
    got = _normalise("forward", values)
    assert got == expected and all(type(v) is float for v in got)
    assert [math.copysign(1, v) for v in got] == [math.copysign(1, v) for v in expected]
