"""Every registry entry declares what its generator builds; the builder remembers schedules;
:func:`schedule_defaults` gives a schedule's own chunks, least M and optimizer."""

from __future__ import annotations

import pytest

from pipeweave.ir import lower
from pipeweave.schedules import (Shape, available_schedules, build_schedule, get_info,
                                 lowered_schedule, registry, schedule_defaults)
from pipeweave.schedules.declared import mismatches


@pytest.mark.parametrize("schedule", [info.name for info in available_schedules()])
def test_the_entry_says_what_the_generator_builds(schedule: str) -> None:
    assert mismatches(schedule) == []


def test_a_false_declaration_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    get_info("1f1b")
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("toy-liar", description="test toy", paper="none", synchronous=True,
                      pipelines=True, chunks=(1,))(get_info("1f1b").generate)
    found = mismatches("toy-liar")
    assert any("pipelines=True but builds as False" in line for line in found)
    assert any("width=False but builds as True" in line for line in found)
    assert any("chunks=(1,) but builds chunks (1, 2, 3, 4)" in line for line in found)


def test_an_unknown_capability_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['widht'\]; declare any of"):
        registry.register("toy-typo", description="", paper="", synchronous=True, widht=True)


def test_every_registered_schedule_is_checkpointable() -> None:
    """Synchronous ones at their flushes; asynchronous ones at the drains --checkpoint-every
    adds (docs/checkpoints.md); AvgPipe's online advance is refused by the check, not here."""
    assert all(info.checkpointable for info in available_schedules())


def test_the_builder_remembers_the_same_shape() -> None:
    shape = Shape(stages=3, microbatches=6, options={})
    first = build_schedule("1f1b", shape)
    assert build_schedule("1f1b", stages=3, microbatches=6) is first
    assert build_schedule("1f1b", Shape(stages=3, microbatches=7)) is not first
    lowered = lowered_schedule("1f1b", shape)
    assert lowered is lowered_schedule("1f1b", Shape(stages=3, microbatches=6))
    assert lowered == lower(first) and lowered.lowered
    with pytest.raises(ValueError, match="needs microbatches >= 4"):
        lowered_schedule("2bw", Shape(stages=4, microbatches=2))


def test_the_builder_keeps_a_bounded_number() -> None:
    first = build_schedule("gpipe", Shape(stages=2, microbatches=1))
    for m in range(2, registry.CACHE_SIZE + 3):
        build_schedule("gpipe", Shape(stages=2, microbatches=m))
    assert registry._generated.cache_info().currsize == registry.CACHE_SIZE
    assert build_schedule("gpipe", Shape(stages=2, microbatches=1)) is not first


def test_a_schedules_own_defaults() -> None:
    assert schedule_defaults("wpipe", 2).chunks == 2
    assert schedule_defaults("wpipe", 2, chunks=4).chunks == 4
    assert schedule_defaults("2bw", 8, microbatches=4).microbatches == 8
    assert schedule_defaults("2bw", 2, microbatches=4).microbatches == 4
    assert schedule_defaults("spectrain", 2).optimizer == ("sgd", {"momentum": 0.9})
    assert schedule_defaults("1f1b", 2, optimizer=("sgd", {})).optimizer == ("sgd", {})
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        schedule_defaults("nope", 2)


def test_every_torch_schedule_named_is_one_torch_has() -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    from pipeweave.schedules import available_schedules

    named = {i.name: i.torch_schedule for i in available_schedules() if i.torch_schedule}
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zbv"} <= set(named)
    for name, torch_name in named.items():
        assert get_schedule_class(torch_name).__name__.lower().endswith(torch_name.lower()), name
