"""A new schedule joins ``simulate``, ``train``, ``auto``, memory and checkpoints by its entry alone.

``toy-flush`` is registered here, not in ``src/``: 1F1B's order laid out by the library's
flush builder under a name of its own, with its capabilities declared on the entry
(:class:`pipeweave.schedules.ScheduleInfo`). No other code knows it, yet the simulator
command, the training command and the in-process runtime, the search's candidates, the
memory model and a checkpoint/resume all take it, and give 1F1B's numbers.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates, search
from pipeweave.cli.main import main
from pipeweave.ir import Schedule
from pipeweave.planner.memory import predicted_memory
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints
from pipeweave.runtime.observation.results import merged_parameters
from pipeweave.schedules import Shape, get_info, registry, schedule_defaults
from pipeweave.schedules.common import flush_schedule
from pipeweave.schedules.declared import mismatches
from pipeweave.schedules.one_f_one_b import one_f_one_b_order

TOY = "toy-flush"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    """``toy-flush``, registered for this test only (the registry is restored after it)."""
    get_info("1f1b")  # load the built-ins first
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def toy_flush(shape: Shape) -> Schedule:
        return flush_schedule(TOY, shape, one_f_one_b_order)

    registry.register(TOY, description="test toy", paper="none", synchronous=True,
                      width=True, replicas=True, chunks=None)(toy_flush)
    return TOY


def test_its_entry_tells_the_truth(toy: str) -> None:
    assert mismatches(toy) == []


def test_a_registered_schedule_is_searched_on_every_axis(toy: str) -> None:
    problem = AutoProblem(profile=small_profile(3), ranks=4, methods=("uniform", "time"))
    per_schedule = Counter(c.schedule for c in enumerate_candidates(problem))
    assert per_schedule[toy] == per_schedule["1f1b"] > 0
    result = search(AutoProblem(profile=small_profile(3), ranks=4, schedules=(toy, "gpipe")))
    assert result.winner.candidate.schedule == toy
    assert result.winner.plan.schedule == toy


def test_simulate_takes_it(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    printed = {}
    for name in (toy, "1f1b"):
        assert main(["simulate", name, "--stages", "3", "--microbatches", "6", "--json"]) == 0
        printed[name] = json.loads(capsys.readouterr().out)
    assert printed[toy]["schedule"] == toy
    for key in ("iteration_time", "bubble_fraction", "peak_activations"):
        assert printed[toy][key] == printed["1f1b"][key]


def test_the_memory_model_takes_it(toy: str) -> None:
    profile = small_profile(5)
    estimates = [predicted_memory(profile, Plan.uniform(6, 3, schedule=name, microbatches=6),
                                  batch_size=12) for name in (toy, "1f1b")]
    assert estimates[0] == estimates[1]
    assert all(rank.total > 0 for rank in estimates[0])


def _job(schedule: str, steps: int) -> Job:
    """A run of ``schedule`` with its own defaults (:func:`schedule_defaults`)."""
    own = schedule_defaults(schedule, 2, microbatches=4)
    model = BuiltinModel("mlp")
    name, kwargs = own.optimizer
    return Job(plan=Plan.uniform(len(model().blocks), 2, chunks=own.chunks, schedule=schedule,
                                 microbatches=own.microbatches),
               steps=steps, model=model, data=BuiltinData("digits", batch_size=16),
               optimizer=OptimizerFactory(name, dict(kwargs)))


def test_train_runs_it_and_resumes_it_exactly(toy: str, tmp_path: Path) -> None:
    straight = run_local(_job(toy, 4))
    reference = merged_parameters(run_local(_job("1f1b", 4)))
    trained = merged_parameters(straight)
    assert all(torch.equal(trained[n], reference[n]) for n in reference)
    run_local(dataclasses.replace(_job(toy, 4),
                                  checkpoint=CheckpointOptions(directory=str(tmp_path), every=2)))
    after2 = complete_checkpoints(tmp_path)[0]
    resumed = merged_parameters(run_local(dataclasses.replace(
        _job(toy, 4), checkpoint=CheckpointOptions(resume=str(after2)))))
    assert all(torch.equal(resumed[n], trained[n]) for n in trained)


def test_the_train_command_runs_it(toy: str, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    assert main(["train", "--schedule", toy, "--model", "mlp", "--steps", "2", "--executor",
                 "local", "--no-progress", "--output-dir", str(tmp_path / "run"),
                 "--json-out", str(summary)]) == 0
    assert json.loads(summary.read_text())["schedule"] == toy


def test_an_asynchronous_one_only_with_semantics_any(monkeypatch: pytest.MonkeyPatch) -> None:
    get_info("1f1b")
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("toy-async", description="test toy", paper="none",
                      synchronous=False)(get_info("pipedream").generate)
    sync = AutoProblem(profile=small_profile(3), ranks=2)
    assert "toy-async" not in {c.schedule for c in enumerate_candidates(sync)}
    anything = AutoProblem(profile=small_profile(3), ranks=2, semantics="any")
    assert "toy-async" in {c.schedule for c in enumerate_candidates(anything)}
