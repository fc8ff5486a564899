"""``pipeweave plan``: the report, the plan file, and running that plan with the runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.cli.options import parse_bytes
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.launch.processes import launch_local
from planner_fixtures import PROFILES, gpt_profile


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.skipif(not PROFILES.exists(), reason="reference profiles not present")
def test_pipedream_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--profile", str(PROFILES / "vgg16.txt"), "--ranks", "4",
                       "--method", "pipedream", "--bandwidth", "1e9", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["stages"] == [[0, 17], [17, 39]] and report["replicas"] == [3, 1]
    assert report["predicted_time_per_minibatch"] == pytest.approx(0.205521, abs=5e-7)
    assert report["noam"] == 2 and report["plan"]["replicas"] == [3, 1]
    assert report["balance"] >= 1 and report["predicted_iteration_time"] > 0
    assert report["planning_seconds"] > 0  # its speed is benchmarks/planning_time.py's job


def test_plan_file_runs_with_the_runtime(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--model", "gpt-tiny", "--ranks", "2", "--method", "autopipe",
                       "--microbatches", "2", "--out", str(out_file))
    assert code == 0
    assert "balance (max/mean stage time)" in out and "planning time" in out
    assert f"pipeweave train --model gpt-tiny --plan {out_file}" in out
    plan = Plan.load(out_file)
    assert plan.num_blocks == 10 and plan.depth == 2 and plan.schedule == "1f1b"
    # the single-process executor runs the planned split (what `train --plan` does)
    job = Job(plan=plan, steps=2, model=BuiltinModel("gpt-tiny"),
              data=BuiltinData("stdlib-bytes", batch_size=4, seq_len=64),
              optimizer=OptimizerFactory("adam"))
    results = run_local(job)
    assert len(results) == 2
    # and through the command line
    code, out, _ = run(capsys, "train", "--model", "gpt-tiny", "--plan", str(out_file), "--executor",
                       "local", "--steps", "1", "--batch-size", "4", "--output-dir",
                       str(tmp_path / "run"), "--no-progress")
    assert code == 0 and "schedule 1f1b  ranks 2" in out


def test_sliced_plan_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile_file = tmp_path / "gpt.json"
    code, _, _ = run(capsys, "profile", "--model", "gpt-tiny", "--batch-size", "2", "--no-link",
                     "--warmup", "0", "--repeats", "1", "--threads", "1", "--json-out", str(profile_file))
    assert code == 0
    out_file = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--model", "gpt-tiny", "--profile", str(profile_file),
                       "--ranks", "3", "--method", "time", "--microbatches", "3", "--slicer",
                       "--json", "--out", str(out_file))
    assert code == 0
    report = json.loads(out)
    assert report["schedule"] == "sliced-1f1b" and report["sliced"] >= 1
    plan = Plan.load(out_file)
    job = Job(plan=plan, steps=1, model=BuiltinModel("gpt-tiny"),
              data=BuiltinData("stdlib-bytes", batch_size=6, seq_len=64),  # halves need 2 rows
              optimizer=OptimizerFactory("sgd", {"lr": 0.1}))
    assert len(run_local(job)) == 3


def test_a_plan_for_another_model_is_rejected_before_any_process_starts(tmp_path: Path) -> None:
    plan = Plan(num_blocks=10, stages=((0, 5), (5, 10)))  # gpt-tiny's 10 blocks
    job = Job(plan=plan, steps=1, model=BuiltinModel("gpt-small"),  # 18 blocks
              data=BuiltinData("stdlib-bytes", batch_size=4, seq_len=128),
              optimizer=OptimizerFactory("adam"))
    with pytest.raises(ValueError, match="plan covers 10 blocks but model 'gpt-small' has 18"):
        launch_local(job)


def test_errors_are_clear(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile_file = tmp_path / "p.json"
    gpt_profile(2).save(profile_file)
    code, _, err = run(capsys, "plan", "--profile", str(profile_file), "--ranks", "2", "--method", "x")
    assert code == 2 and "unknown planner method 'x'" in err
    code, _, err = run(capsys, "plan", "--profile", str(profile_file), "--ranks", "9",
                       "--method", "time")
    assert code == 2 and "cannot split 6 blocks into 9 stages" in err
    code, _, err = run(capsys, "plan", "--profile", str(profile_file), "--ranks", "2",
                       "--method", "time", "--memory-limit", "1KiB")
    assert code == 2 and "satisfies the constraints (e.g. the memory limit)" in err
    code, _, err = run(capsys, "plan", "--model", "gpt-tiny", "--profile", str(profile_file),
                       "--ranks", "2", "--method", "time")
    assert code == 2 and "--model gpt-tiny has 10 blocks" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "pipeweave.profile/1", "blocks": [{"name": "a"}]}')
    code, _, err = run(capsys, "plan", "--profile", str(broken), "--ranks", "1", "--method", "time")
    assert code == 2 and "block 0 has missing fields" in err
    code, _, err = run(capsys, "plan", "--ranks", "1", "--method", "time")
    assert code == 2 and "give --model NAME (profiled now) or --profile FILE" in err


def test_parse_bytes() -> None:
    assert parse_bytes("16e9") == 16e9 and parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("512 MB") == 512e6
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes("lots")


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_replicated_pipedream_plan_runs_with_train(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """A PipeDream plan with unequal replica counts (a heavy, replicated first stage) goes from
    ``pipeweave plan`` to ``pipeweave train --plan`` on real processes (1F1B-RR)."""
    from pipeweave.profiler import BlockProfile, LinkProfile, Profile

    names = [f"b{i}" for i in range(10)]  # gpt-tiny has 10 blocks
    costs = [8.0] * 3 + [1.0] * 7  # ms of forward; backward twice that
    weights = [1e3] * 3 + [5e7] * 7  # bytes: replicating the tail would all-reduce 350 MB
    profile = Profile(tuple(BlockProfile(n, c * 1e-3, 2 * c * 1e-3, 1e3, 4e3, w)
                            for n, c, w in zip(names, costs, weights)),
                      model="gpt-tiny", batch_size=2, device="cpu", link=LinkProfile(1e9, 1e-5))
    profile_file, plan_file = tmp_path / "profile.json", tmp_path / "plan.json"
    profile.save(profile_file)
    code, out, err = run(capsys, "plan", "--profile", str(profile_file), "--model", "gpt-tiny",
                         "--ranks", "3", "--method", "pipedream", "--out", str(plan_file), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["replicas"] == [2, 1] and report["stages"] == [[0, 3], [3, 10]]
    code, out, err = run(capsys, "train", "--model", "gpt-tiny", "--plan", str(plan_file),
                         "--steps", "2", "--batch-size", "12", "--output-dir", str(tmp_path / "run"),
                         "--no-progress", "--timeout", "200")
    assert code == 0, err
    assert "schedule pipedream  ranks 3" in out


def test_shared_cores_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import dataclasses

    cpu = dataclasses.replace(gpt_profile(4), device="cpu", source="measured",
                              metadata={"cores": 2, "sharing_overhead": 1.1})
    path = tmp_path / "cpu.json"
    cpu.save(path)

    def report(*extra: str) -> dict:  # type: ignore[type-arg]
        code, out, _ = run(capsys, "plan", "--profile", str(path), "--method", "time", "--json",
                           *extra)
        assert code == 0
        return json.loads(out)

    auto = report("--ranks", "4")  # a CPU profile of a 2-core machine, 4 ranks: they share
    assert auto["shared_cores"] == 2 and auto["sharing_overhead"] == 1.1
    assert "shared_cores" not in report("--ranks", "2")  # a core each
    separate = report("--ranks", "4", "--shared-cores", "none")
    assert "shared_cores" not in separate
    assert auto["predicted_iteration_time"] > 1.1 * separate["predicted_iteration_time"]
    assert report("--ranks", "4", "--shared-cores", "1")["shared_cores"] == 1
    code, _, err = run(capsys, "plan", "--profile", str(path), "--method", "time", "--ranks", "4",
                       "--shared-cores", "two")
    assert code == 2 and "--shared-cores 'two' is not a core count; give a number >= 1" in err
