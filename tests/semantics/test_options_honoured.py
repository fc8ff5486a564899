"""Every weight-semantics option is honoured on its schedules and refused everywhere else."""

from __future__ import annotations

import pytest
import torch

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.planner.semantics_options import SEMANTICS_OPTIONS, schedules_taking
from pipeweave.schedules import available_schedules
from pipeweave.testing import merged_parameters

NON_DEFAULT = {"backward": "graph", "alpha": 0.2, "average_order": "update-then-dilute"}
SHAPE = {"pipeoptim": {}, "avgpipe": {"pipelines": 2}}


def test_every_option_has_a_non_default_value_here() -> None:
    assert set(NON_DEFAULT) == set(SEMANTICS_OPTIONS)


def run(schedule: str, semantics: dict) -> dict[str, torch.Tensor]:
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(6, 3, schedule=schedule, microbatches=3, semantics=semantics,
                        **SHAPE.get(schedule, {}))
    job = Job(plan=plan, steps=3, model=model,
              data=BuiltinData("stdlib-bytes", batch_size=6, seq_len=8, dtype="float64"),
              optimizer=OptimizerFactory("adam", {"lr": 1e-2}), return_parameters=True)
    return merged_parameters(run_local(job))


@pytest.mark.parametrize("option", sorted(SEMANTICS_OPTIONS))
def test_option_changes_the_run_on_its_schedules(option: str) -> None:
    assert schedules_taking(option), f"no registered schedule declares {option}"
    for schedule in schedules_taking(option):
        default, changed = run(schedule, {}), run(schedule, {option: NON_DEFAULT[option]})
        assert any(not torch.equal(default[n], changed[n]) for n in default), (option, schedule)


@pytest.mark.parametrize("option", sorted(SEMANTICS_OPTIONS))
def test_option_is_refused_on_every_other_schedule(option: str) -> None:
    for info in available_schedules():
        if option in info.semantics:
            continue
        with pytest.raises(ValueError, match=f"applies to .* only, not to schedule '{info.name}'"):
            Plan.uniform(6, 2, schedule=info.name, semantics={option: NON_DEFAULT[option]})


@pytest.mark.parametrize(("semantics", "match"), [
    ({"lookahead": 2}, "unknown weight-semantics option 'lookahead'"),
    ({"backward": "graf"}, r"must be one of \['recompute', 'graph'\]"),
    ({"alpha": 1.5}, r"must be a number in \[0, 1\]"),
])
def test_unknown_or_invalid_values_are_refused(semantics: dict, match: str) -> None:
    schedule = "avgpipe" if "alpha" in semantics else "pipeoptim"
    with pytest.raises(ValueError, match=match):
        Plan.uniform(6, 2, schedule=schedule, semantics=semantics)
