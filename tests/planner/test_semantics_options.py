"""Plan.semantics: a typed record whose JSON form holds only the options given."""

from __future__ import annotations

import json
import pickle
from dataclasses import fields, replace

import pytest

from pipeweave.planner import Plan, Semantics
from pipeweave.planner.semantics_options import SEMANTICS_OPTIONS


def test_one_field_per_option_none_when_not_given() -> None:
    assert [f.name for f in fields(Semantics)] == list(SEMANTICS_OPTIONS)
    assert Semantics() == Semantics(None, None, None)
    assert Semantics().given() == {}


def test_defaults_resolve_as_attributes() -> None:
    assert Semantics().backward_mode == "recompute"
    assert Semantics(backward="graph").backward_mode == "graph"
    assert Semantics().order == "simultaneous"
    assert Semantics(average_order="update-then-dilute").order == "update-then-dilute"
    assert Semantics().alpha is None  # 1/N, applied by the averager that knows N


def test_a_plain_mapping_is_converted() -> None:
    plan = Plan.uniform(6, 3, schedule="pipeoptim", semantics={"backward": "graph"})
    assert plan.semantics == Semantics(backward="graph")
    assert plan == Plan.uniform(6, 3, schedule="pipeoptim", semantics=Semantics(backward="graph"))
    assert Plan.uniform(6, 2).semantics == Semantics()


def test_json_holds_only_the_given_options_as_given(tmp_path) -> None:
    plan = Plan.uniform(6, 2, schedule="avgpipe", pipelines=2,
                        semantics={"alpha": 1, "average_order": "update-then-dilute"})
    assert plan.to_json()["semantics"] == {"alpha": 1, "average_order": "update-then-dilute"}
    assert Plan.uniform(6, 2).to_json()["semantics"] == {}
    path = tmp_path / "plan.json"
    plan.save(path)
    text = path.read_text()
    assert '"semantics": {\n    "alpha": 1,\n    "average_order": "update-then-dilute"\n  }' in text
    again = Plan.load(path)
    assert again == plan
    again.save(path)
    assert path.read_text() == text  # byte for byte


def test_plan_stays_picklable_and_semantics_hashable() -> None:
    plan = Plan.uniform(6, 3, schedule="pipeoptim", semantics={"backward": "graph"})
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert len({Semantics(backward="graph"), Semantics(backward="graph"), Semantics()}) == 2


def test_unknown_names_are_refused_in_dicts_and_json() -> None:
    match = r"unknown weight-semantics option 'lookahead'.*schedule_options"
    with pytest.raises(ValueError, match=match):
        Plan.uniform(6, 2, schedule="pipeoptim", semantics={"lookahead": 2})
    with pytest.raises(ValueError, match=match):
        Plan.from_json(json.loads('{"num_blocks": 6, "stages": [[0, 3], [3, 6]], '
                                  '"schedule": "pipeoptim", "semantics": {"lookahead": 2}}'))
    with pytest.raises(TypeError, match="mapping of option names"):
        Plan.uniform(6, 2, semantics=["backward"])  # type: ignore[arg-type]


def test_a_typed_option_is_refused_on_another_schedule_with_the_same_message() -> None:
    with pytest.raises(ValueError) as error:
        Plan.uniform(6, 2, schedule="1f1b", semantics={"alpha": 0.5})
    as_dict = str(error.value)
    with pytest.raises(ValueError) as error:
        Plan.uniform(6, 2, schedule="1f1b", semantics=Semantics(alpha=0.5))
    as_record = str(error.value)
    assert as_dict == as_record
    assert "applies to avgpipe only, not to schedule '1f1b'" in as_record
    plan = Plan.uniform(6, 2, schedule="avgpipe", pipelines=2)
    with pytest.raises(ValueError, match=r"alpha=1.5 \(--alpha\) must be a number in \[0, 1\]"):
        replace(plan, semantics=replace(plan.semantics, alpha=1.5))
