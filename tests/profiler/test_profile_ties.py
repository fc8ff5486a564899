"""A profile records the parameters several blocks share (tied word embeddings): the profiler
fills them from the model, JSON keeps them, and profiles written before them still load. The
profiler also measures APC's codec rate (``apc_bytes_per_second``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeweave.models import ModelSpec
from pipeweave.profiler import BlockProfile, Profile, TieProfile
from pipeweave.profiler.measure import profile_model
from pipeweave.testing import TiedHead

VOCAB, WIDTH = 11, 6


def _tied() -> ModelSpec:
    torch.manual_seed(0)
    embed = nn.Embedding(VOCAB, WIDTH)
    return ModelSpec.from_blocks(
        [embed, nn.Linear(WIDTH, WIDTH), nn.Tanh(), TiedHead(embed.weight)],
        lambda logits, targets: nn.functional.cross_entropy(logits.flatten(0, 1),
                                                            targets.flatten()), "tied")


def _blocks(n: int) -> tuple[BlockProfile, ...]:
    return tuple(BlockProfile(f"b{i}", forward=1.0, backward=2.0, output_bytes=8.0,
                              activation_bytes=8.0, parameter_bytes=100.0) for i in range(n))


def test_the_profiler_records_the_tie_with_its_bytes() -> None:
    ids = torch.randint(0, VOCAB, (2, 5))
    profile = profile_model(_tied(), ids, torch.randint(0, VOCAB, (2, 5)), warmup=0, repeats=1)
    assert profile.ties == (TieProfile(blocks=(0, 3), parameter_bytes=VOCAB * WIDTH * 4.0,
                                       names=("0.weight", "3.weight")),)
    assert profile.apc_bytes_per_second is not None and 0 < profile.apc_bytes_per_second < 1e13
    # each holder was measured alone, so both count it
    assert profile.blocks[0].parameter_bytes == VOCAB * WIDTH * 4
    assert profile.blocks[3].parameter_bytes == VOCAB * WIDTH * 4


def test_ties_survive_json_and_old_profiles_load_without(tmp_path: Path) -> None:
    profile = Profile(_blocks(4), ties=(TieProfile((0, 3), 100.0, ("0.w", "3.w")),))
    path = tmp_path / "p.json"
    profile.save(path)
    assert Profile.load(path) == profile
    old = json.loads(path.read_text())
    del old["ties"]
    path.write_text(json.dumps(old))
    assert Profile.load(path).ties == ()
    assert "ties" not in Profile(_blocks(2)).to_json()  # an untied profile reads as before


def test_shared_bytes_count_a_tie_once_per_stage() -> None:
    profile = Profile(_blocks(4), ties=(TieProfile((0, 3), 60.0),))
    assert profile.stage_parameter_bytes(0, 4) == 400.0 - 60.0  # both uses on one stage
    assert profile.stage_parameter_bytes(0, 2) == 200.0  # a copy on each holder
    assert profile.stage_parameter_bytes(2, 4) == 200.0
    assert TieProfile((0, 3), 60.0).stages(((0, 2), (2, 4))) == (0, 1)


@pytest.mark.parametrize("ties,match", [
    ([{"blocks": [3], "parameter_bytes": 1}], "two or more distinct"),
    ([{"blocks": [0, 9], "parameter_bytes": 1}], "blocks below 4"),
    ([{"blocks": [0, 2]}], "parameter_bytes"),
    ("x", "'ties' must be a list"),
])
def test_a_bad_tie_is_one_clear_error(ties: object, match: str) -> None:
    data = Profile(_blocks(4)).to_json()
    data["ties"] = ties
    with pytest.raises(ValueError, match=match):
        Profile.from_json(data)
