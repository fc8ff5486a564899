"""The JSON profile: round trip, schema tag, and malformed input rejected with clear messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeweave.profiler import SCHEMA, BlockProfile, LinkProfile, Profile


def sample() -> Profile:
    blocks = (
        BlockProfile("embed", 1e-3, 2e-3, 4096, 4096, 1024, 2048, 9000),
        BlockProfile("head", 2e-3, 3e-3, 1000, 5000, 2048),
    )
    return Profile(blocks, model="toy", batch_size=4, device="cpu", input_bytes=64,
                   link=LinkProfile(2e9, 5e-5), metadata={"repeats": 5})


def test_round_trip_through_json(tmp_path: Path) -> None:
    profile = sample()
    path = tmp_path / "p.json"
    profile.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA == "pipeweave.profile/1"
    assert data["blocks"][0] == {"name": "embed", "forward": 1e-3, "backward": 2e-3,
                                 "output_bytes": 4096.0, "activation_bytes": 4096.0,
                                 "parameter_bytes": 1024.0, "optimizer_bytes": 2048.0,
                                 "peak_memory_bytes": 9000.0, "update": 0.0, "weight_grad": 0.0,
                                 "input_grad": 0.0, "pending_bytes": 0.0, "recorded_bytes": 0.0}
    assert Profile.load(path) == profile


def test_columns() -> None:
    profile = sample()
    assert profile.num_blocks == 2
    assert profile.compute == pytest.approx((3e-3, 5e-3))
    assert profile.output_bytes == (4096.0, 1000.0)
    assert profile.parameter_bytes == (1024.0, 2048.0)
    assert profile.link is not None and profile.link.transfer_time(2e9) == pytest.approx(1 + 5e-5)


def mutate(change: Any) -> dict[str, Any]:
    data = sample().to_json()
    change(data)
    return data


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(schema="pipeweave.profile/2"), "schema 'pipeweave.profile/2'"),
    (lambda d: d.pop("schema"), "schema None"),
    (lambda d: d.update(colour="red"), "unknown fields ['colour']"),
    (lambda d: d.update(blocks=[]), "has no blocks"),
    (lambda d: d.update(blocks="abc"), "'blocks' must be a list"),
    (lambda d: d["blocks"][0].pop("forward"), "missing fields ['forward']"),
    (lambda d: d["blocks"][0].update(forward=-1.0), "block 'embed' forward must be a finite number >= 0"),
    (lambda d: d["blocks"][1].update(backward="fast"), "block 'head' backward must be a number"),
    (lambda d: d["blocks"][1].update(name="embed"), "duplicate block names ['embed']"),
    (lambda d: d.update(batch_size=0), "batch_size must be an integer >= 1"),
    (lambda d: d.update(link={"bandwidth": 0}), "bandwidth must be > 0"),
])
def test_malformed_profiles_are_rejected(change: Any, message: str) -> None:
    with pytest.raises(ValueError) as error:
        Profile.from_json(mutate(change), origin="profile file p.json")
    assert message in str(error.value)
    assert str(error.value).startswith("profile file p.json: ")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file; create one with `pipeweave profile"):
        Profile.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Profile.load(bad)


def test_a_profile_without_weight_grad_still_loads(tmp_path: Path) -> None:
    """Profiles written before the split backward was measured: W unknown (0)."""
    data = sample().to_json()
    for block in data["blocks"]:
        del block["weight_grad"], block["input_grad"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert all(block.weight_grad == block.input_grad == 0.0 for block in Profile.load(path).blocks)


def test_stash_bytes_leave_out_parameters_of_profiles_written_before() -> None:
    # Profiles written before the profiler left the blocks' own weights out of
    # activation_bytes (metadata has peak_memory, not activation_bytes) get them subtracted;
    # new ones and hand-built ones are taken as they are.
    blocks = (BlockProfile("a", 1.0, 2.0, 10.0, 500.0, 200.0),
              BlockProfile("b", 1.0, 2.0, 10.0, 100.0, 300.0))
    old = Profile(blocks, metadata={"peak_memory": "estimated"})
    new = Profile(blocks, metadata={"peak_memory": "measured",
                                    "activation_bytes": "parameters excluded"})
    assert old.stash_bytes == (300.0, 0.0)
    assert new.stash_bytes == Profile(blocks).stash_bytes == (500.0, 100.0)
