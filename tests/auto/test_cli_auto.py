"""``pipeweave auto``: the --json contract, the plan file ``pipeweave train --plan`` reads,
the Pareto PNG, one-line errors, and (distributed) ``--run`` on gpt-tiny with two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auto_fixtures import small_profile
from pipeweave.cli.cmd_train import build_setup
from pipeweave.cli.main import build_parser, main
from pipeweave.planner.plan import Plan
from pipeweave.profiler import Profile

SRC = Path(__file__).resolve().parents[2] / "src"


def _profile(tmp_path: Path, blocks: int = 10, model: str = "gpt-tiny") -> Path:
    profile = small_profile(11, blocks=blocks)
    path = tmp_path / "profile.json"
    Profile(profile.blocks, model=model, batch_size=4, device="synthetic",
            source="synthetic").save(path)
    return path


def _auto(tmp_path: Path, *extra: str) -> list[str]:
    return ["auto", "--profile", str(_profile(tmp_path)), "--out", str(tmp_path / "plan.json"),
            "--plot", str(tmp_path / "front.png"), *extra]


def test_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_auto(tmp_path, "--ranks", "2", "--json", "--top", "3")) == 0
    report = json.loads(capsys.readouterr().out)
    winner = report["winner"]
    for key in ("schedule", "stages", "microbatches", "predicted_iteration_time",
                "predicted_peak_memory_bytes", "plan"):
        assert key in winner
    assert len(winner["predicted_peak_memory_bytes"]) == 2
    assert report["considered"] == (report["invalid"] + report["pruned"] + report["simulated"]
                                    + report["duplicates"] + report["unexamined"]
                                    + report["over_budget"])
    assert report["simulated"] > 0 and report["pruned"] > 0
    assert 1 <= len(report["table"]) <= 3
    assert report["table"][0] == winner
    assert "measured" not in report
    rates = [row["predicted_samples_per_second"] for row in report["table"]]
    assert rates == sorted(rates, reverse=True)
    assert winner["predicted_samples_per_second"] >= \
        report["default"]["predicted_samples_per_second"]
    assert Plan.load(tmp_path / "plan.json").to_json() == winner["plan"]
    assert (tmp_path / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plan_file_is_what_train_accepts(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_auto(tmp_path, "--ranks", "2", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    args = build_parser().parse_args(["train", "--model", "gpt-tiny", "--plan",
                                      str(tmp_path / "plan.json"), "--batch-size",
                                      str(report["batch_size"])])
    job = build_setup(args).job
    assert job.plan.to_json() == report["winner"]["plan"]


def test_table_and_counts_on_screen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_auto(tmp_path, "--ranks", "4", "--top", "4")) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[1].split()[:4] == ["#", "schedule", "split", "(blocks"]
    assert [line.split()[0] for line in lines[2:7]] == ["1", "2", "3", "4", "default"]
    assert "candidates considered" in captured.out and "pruned" in captured.out
    assert "auto: searching" in captured.err  # progress on stderr


def test_a_limit_nothing_fits_is_one_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_auto(tmp_path, "--ranks", "2", "--memory-limit", "1KB")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pipeweave: error: no candidate fits --memory-limit 1000 bytes")
    assert not (tmp_path / "plan.json").exists()


def test_the_memory_limit_is_respected(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_auto(tmp_path, "--ranks", "2", "--json")) == 0
    free = json.loads(capsys.readouterr().out)
    limit = 0.8 * max(free["winner"]["predicted_peak_memory_bytes"])
    assert main(_auto(tmp_path, "--ranks", "2", "--json", "--memory-limit", str(limit))) == 0
    bound = json.loads(capsys.readouterr().out)
    assert max(bound["winner"]["predicted_peak_memory_bytes"]) <= limit
    assert all(max(row["predicted_peak_memory_bytes"]) <= limit for row in bound["table"])


@pytest.mark.parametrize("argv,message", [
    (["--schedules", "nope"], "unknown schedule 'nope'"),
    (["--methods", "nope"], "unknown planner method 'nope'"),
    (["--top", "0"], "--top must be >= 1"),
    (["--microbatches", "a,b"], "--microbatches 'a,b' must be whole numbers"),
])
def test_bad_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    assert main(_auto(tmp_path, "--ranks", "2", *argv)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_run_trains_the_winner_and_the_default(tmp_path: Path) -> None:
    from pipeweave.profiler.measure import profile_builtin

    path = tmp_path / "tiny.json"
    profile_builtin("gpt-tiny", batch_size=4, warmup=0, repeats=1).save(path)
    command = [sys.executable, "-m", "pipeweave", "auto", "--model", "gpt-tiny", "--profile",
               str(path), "--ranks", "2", "--run", "--steps", "3", "--json", "--timeout", "60",
               "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "p.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # stdout holds the one object, nothing the ranks print
    calibration = report["calibration"]  # the three calibration plans, alternated
    assert set(calibration["plans"]) == {"default", "data-parallel", "data-parallel-small"}
    assert calibration["message_latency"] >= 0 and calibration["allreduce_latency"] >= 0
    assert calibration["compute_per_action"] >= 0
    for label in ("winner", "default"):
        measured = report["measured"][label]
        assert measured["iteration_time"] > 0
        assert len(measured["rounds"]) == 3 and measured["steps_per_round"] == 3
        assert measured["iteration_time"] == sorted(measured["rounds"])[1]
        assert len(measured["peak_memory_bytes"]) == 2
        assert all(m > 0 for m in measured["peak_memory_bytes"])
        predicted = measured["predicted_peak_memory_bytes"]
        for p, m in zip(predicted, measured["peak_memory_bytes"]):  # the allocator's peak
            assert 0.5 < p / m < 2.0, (predicted, measured["peak_memory_bytes"])
        # predicted again from the calibration plans re-timed in the same rounds
        assert measured["retimed_prediction"] > 0 and measured["retimed_error"] >= 0
    retimed = report["retimed"]
    assert set(retimed["plans"]) == set(calibration["plans"])
    for label, plan in retimed["plans"].items():
        assert len(plan["rounds"]) == 3 and plan["steps_per_round"] == 3
        assert plan["calibration_median"] == calibration["plans"][label]["median"]
        assert plan["drift"] == pytest.approx(plan["median"] / plan["calibration_median"] - 1)
    assert retimed["fitted"]["message_latency"] >= 0


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_model_is_calibrated_unless_told_not_to(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With --model, auto measures the link, the runtime's costs per action, the all-reduce's
    bandwidth, and the message latency and all-reduce cost (alternating runs of the default
    and a data-parallel plan) before it searches (the simulator adds them to the blocks'
    times); --no-calibration skips all of it."""
    common = ["auto", "--model", "mlp", "--ranks", "2", "--json", "--schedules", "1f1b",
              "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "front.png")]
    profile_out = tmp_path / "calibrated.json"
    assert main([*common, "--profile-out", str(profile_out)]) == 0
    calibrated = capsys.readouterr()
    assert "calibrated in" in calibrated.err and "message latency" in calibrated.err
    fit = json.loads(calibrated.out)["calibration"]
    assert fit["plans"]["default"]["median"] > 0 and fit["message_latency"] >= 0
    assert fit["plans"]["data-parallel"]["median"] > 0 and fit["allreduce_latency"] >= 0
    assert fit["compute_scale"] >= 0.25 and len(fit["plans"]["default"]["compute_seconds"]) == 3
    assert len(fit["per_round"]) == 3  # each round's own fit, the parameters their medians
    assert all(c > 0 for c in fit["plans"]["default"]["compute_seconds"])
    saved = Profile.load(profile_out)
    assert saved.link is not None and saved.runtime is not None
    assert saved.runtime.message_latency == fit["message_latency"]
    assert saved.runtime.allreduce_latency == fit["allreduce_latency"]
    assert saved.runtime.allreduce_bandwidth is not None
    # a scale below 1 went into the blocks' times (bounds stay bounds), the runtime keeps 1
    assert saved.runtime.compute_scale == max(1.0, fit["compute_scale"])
    assert main([*common, "--no-calibration"]) == 0
    plain = capsys.readouterr()
    assert "calibrated in" not in plain.err and "measuring the link" not in plain.err
    assert "calibration" not in json.loads(plain.out)
    # the costs are priced: the same default plan is predicted differently with them
    assert json.loads(calibrated.out)["default"]["predicted_iteration_time"] != \
        json.loads(plain.out)["default"]["predicted_iteration_time"]


def test_calibration_off_cpu_is_said_not_skipped_silently(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --device cuda the calibration (CPU runs) cannot apply: auto says so in one note."""
    assert main(["auto", "--model", "gpt-tiny", "--profile", str(_profile(tmp_path)),
                 "--device", "cuda", "--ranks", "2", "--schedules", "1f1b",
                 "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "p.png")]) == 0
    err = capsys.readouterr().err
    assert "note: runtime costs are measured on CPU only" in err
    assert "no message latency fitted" in err and "Traceback" not in err


def test_the_winner_is_written_in_megatron_and_torchtitan_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from pipeweave.planner.interchange import megatron_layout

    names = ["embed", *(f"layer{i}" for i in range(8)), "head"]
    blocks = [dataclasses.replace(b, name=n) for b, n in zip(small_profile(11, blocks=10).blocks,
                                                               names)]
    Profile(tuple(blocks), model="gpt-tiny", batch_size=4, device="synthetic",
            source="synthetic").save(tmp_path / "named.json")
    assert main(["auto", "--profile", str(tmp_path / "named.json"), "--ranks", "2", "--json",
                 "--out", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "f.png")]) == 0
    report = json.loads(capsys.readouterr().out)
    exports = report["plan_exports"]
    plan = Plan.load(tmp_path / "plan.json")
    assert exports["megatron"] == str(tmp_path / "plan.megatron.txt")
    layout = (tmp_path / "plan.megatron.txt").read_text().strip()
    assert layout == megatron_layout(plan, names) and layout.count("|") == len(plan.stages) - 1
    if exports["torchtitan"].startswith("none: "):  # a schedule torch does not run
        assert not (tmp_path / "plan.torchtitan.toml").exists()
    else:
        assert f"pipeline_parallel_degree = {len(plan.stages) // plan.chunks}" in \
            (tmp_path / "plan.torchtitan.toml").read_text()
