"""The command line, in-process through ``main([...])`` and once through ``python -m pipeweave``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.cli.cmd_schedules import CHOOSING
from pipeweave.cli.main import main
from pipeweave.schedules import available_schedules

SRC = Path(__file__).resolve().parents[2] / "src"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schedules_lists_names_descriptions_and_papers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedules")
    assert code == 0
    for info in available_schedules():
        assert info.name in out and info.paper in out and info.description in out
    gpipe_line = next(line for line in out.splitlines() if line.startswith("gpipe "))
    assert "sync" in gpipe_line


def test_schedules_point_to_the_page_on_choosing(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "schedules")
    assert out.rstrip().splitlines()[-1] == CHOOSING
    page = Path(__file__).resolve().parents[2] / "docs" / "choosing.md"
    assert page.is_file() and "docs/choosing.md" in CHOOSING
    text = page.read_text()
    for schedule in available_schedules():  # the page covers every registered schedule
        assert re.search(rf"`{re.escape(schedule.name)}[` ]", text), schedule.name


@pytest.mark.parametrize(("schedule", "sees"), [
    ("gpipe", "one batch"), ("1f1b", "one batch"), ("2bw", "one batch"), ("wpipe", "one batch"),
    ("avgpipe", "one batch (--batch-size samples) per parallel pipeline"),
    ("pipedream", "one micro-batch"), ("pipeoptim", "one micro-batch"),
    ("spectrain", "one micro-batch"), ("zb-h1", "one batch"), ("zb-h2", "one batch"),
])
def test_schedules_say_how_many_samples_one_update_sees(
        capsys: pytest.CaptureFixture[str], schedule: str, sees: str) -> None:
    _, out, _ = run(capsys, "schedules")
    lines = out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(f"{schedule} "))
    assert f"one update sees: {sees}" in lines[index + 2]


@pytest.mark.parametrize("schedule", ["pipeoptim", "spectrain"])
def test_schedules_state_the_recomputed_forward(capsys: pytest.CaptureFixture[str],
                                                schedule: str) -> None:
    _, out, _ = run(capsys, "schedules")
    lines = out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(f"{schedule} "))
    assert "cost: every stage but the last runs its forward twice" in lines[index + 3]
    others = [line for line in lines if "cost:" in line]
    assert len(others) == 2  # 1F1B, PipeDream, 2BW, WPipe...: one forward, one backward


def test_show_prints_the_grid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "gpipe.csv"
    code, out, _ = run(capsys, "show", "gpipe", "--stages", "2", "--microbatches", "2",
                       "--csv", str(csv))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("gpipe: 2 stages on 2 ranks, M=2, K=1")
    assert lines[2].split() == ["rank0", "0F0@0", "0F1@0", "0B0@0", "0B1@0", "0U@1"]
    assert lines[3].split() == ["rank1", "1F0@0", "1F1@0", "1B0@0", "1B1@0", "1U@1"]
    assert csv.read_text().splitlines()[0] == "0F0@0,0F1@0,0B0@0,0B1@0,0U@1"


def test_show_lowered_and_shape_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "1f1b", "-P", "2", "-M", "2", "--lowered")
    assert code == 0 and "0SF0" in out and "1RF0" in out and "lowered" in out.splitlines()[0]
    code, out, _ = run(capsys, "show", "1f1b", "-P", "2", "-M", "4", "--replicas", "2,1")
    assert code == 0 and "0AR@1" in out and "3 ranks" in out.splitlines()[0]


def test_simulate_json_matches_closed_forms(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "1f1b", "--stages", "4", "--microbatches", "8", "--json")
    assert code == 0
    data = json.loads(out)
    check_1f1b_p4_m8(data)


def check_1f1b_p4_m8(data: dict) -> None:  # type: ignore[type-arg]
    assert (data["schedule"], data["stages"], data["microbatches"]) == ("1f1b", 4, 8)
    assert data["iteration_time"] == (8 + 4 - 1) * (1 + 2)
    assert data["bubble_fraction"] == pytest.approx(3 / 11)
    assert data["peak_activations"] == [4, 3, 2, 1]
    assert data["weight_versions"] == [1, 1, 1, 1]
    assert data["master_stage"] == 3
    assert data["critical_path"][0] == "0F0@0" and data["critical_path"][-1] == "0B7@0"


def test_show_and_simulate_a_split_backward(capsys: pytest.CaptureFixture[str]) -> None:
    """zb-h1 shows its I and W; simulate takes --backward as the whole backward and
    --weight-grad as its W part (default half), and peak_activations counts an activation
    until its W: P=4, M=8 at F = I = W = 1 is 27 with 4 held on every rank (1F1B: 33)."""
    code, out, _ = run(capsys, "show", "zb-h1", "-P", "2", "-M", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("zb-h1: 2 stages on 2 ranks, M=2, K=1, synchronous")
    assert lines[2].split() == ["rank0", "0F0@0", "0F1@0", "0I0@0", "0W0@0", "0I1@0", "0W1@0", "0U@1"]
    assert lines[3].split() == ["rank1", "1F0@0", "1I0@0", "1F1@0", "1I1@0", "1W0@0", "1W1@0", "1U@1"]
    code, out, _ = run(capsys, "schedules")
    assert "zb-h1 " in out and "zb-h2 " in out and "Zero Bubble Pipeline Parallelism, ICLR 2024" in out
    for argv, time, held, weight_grad in [
        ([], 27.0, [4, 4, 4, 4], 1.0),
        (["--backward", "2", "--weight-grad", "1"], 27.0, [4, 4, 4, 4], 1.0),
        (["--forward", "1", "--backward", "3", "--weight-grad", "1"], 38.0, [4, 4, 4, 4], 1.0),
        (["--backward", "2,2,2,2", "--weight-grad", "0.5,0.5,0.5,0.5"], 8 * 3 + 3 * 2,
         [4, 4, 4, 4], [0.5] * 4),
    ]:
        code, out, _ = run(capsys, "simulate", "zb-h1", "-P", "4", "-M", "8", "--json", *argv)
        data = json.loads(out)
        assert code == 0 and data["iteration_time"] == time, argv
        assert data["peak_activations"] == held and data["costs"]["weight_grad"] == weight_grad
    code, out, _ = run(capsys, "simulate", "zb-h2", "-P", "4", "-M", "8", "--json")
    assert (json.loads(out)["iteration_time"], json.loads(out)["peak_activations"]) == (27.0, [7] * 4)
    code, out, _ = run(capsys, "simulate", "1f1b", "-P", "4", "-M", "8", "--json", "-W", "0.5")
    assert json.loads(out)["iteration_time"] == 33.0  # whole backwards: W changes nothing
    code, out, _ = run(capsys, "simulate", "zb-h1", "-P", "4", "-M", "8")
    assert "iteration time    27" in out and "per rank: 4 4 4 4  (held from F until B or W)" in out


def test_simulate_per_stage_costs_and_comm(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "gpipe", "-P", "3", "-M", "4", "--forward", "1,2,1",
                       "--backward", "2,4,2", "--json")
    assert code == 0 and json.loads(out)["master_stage"] == 1
    code, out, _ = run(capsys, "simulate", "gpipe", "-P", "3", "-M", "4", "--comm", "0.5", "--json")
    assert json.loads(out)["iteration_time"] == pytest.approx((4 + 2) * 3 + 2 * 2 * 0.5)


def test_simulate_table_trace_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace, plot = tmp_path / "t.json", tmp_path / "t.png"
    code, out, _ = run(capsys, "simulate", "gpipe", "-P", "3", "-M", "3", "--trace", str(trace),
                       "--plot", str(plot))
    assert code == 0
    assert "iteration time    15" in out and "bubble fraction   0.4000" in out
    assert "peak activations  per rank: 3 3 3" in out and "master stage      2" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("cat") in ("forward", "backward")) == 18
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "nope", "-P", "2", "-M", "2"], "unknown schedule 'nope'; choose one of:"),
        (["simulate", "1f1b", "-P", "0", "-M", "2"], "stages must be an integer >= 1, got 0"),
        (["simulate", "1f1b", "-P", "2", "-M", "2", "-F", "1,2,3"], "forward has 3 values"),
        (["simulate", "1f1b", "-P", "2", "-M", "2", "-F", "fast"], "--forward 'fast' must be a number"),
        (["simulate", "zb-h1", "-P", "2", "-M", "2", "-W", "x"], "--weight-grad 'x' must be a number"),
        (["simulate", "zb-h1", "-P", "2", "-M", "2", "-B", "2,4", "-W", "1,5"],
         "weight_grad 5 exceeds backward 4 on stage 1"),
        (["show", "zb-h2", "-P", "2", "-M", "2", "-V", "2"], "use chunks=1"),
        (["show", "1f1b", "-P", "2", "-M", "2", "-o", "advance"], "is not KEY=VALUE"),
        (["show", "1f1b", "-P", "2", "-M", "2", "--replicas", "2,x"], "--replicas '2,x' must be"),
    ],
)
def test_user_errors_exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("pipeweave: error: ") and message in err
    assert "Traceback" not in err


def test_too_few_microbatches_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    if "2bw" not in {info.name for info in available_schedules()}:
        pytest.skip("2bw is not registered yet")
    code, _, err = run(capsys, "simulate", "2bw", "-P", "4", "-M", "2")
    assert code == 2 and "microbatches >= 4" in err and "raise --microbatches" in err


def test_argparse_errors_and_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", "1f1b", "-P", "2")  # -M missing
    assert code == 2 and "--microbatches" in err
    code, _, err = run(capsys, )
    assert code == 2 and "usage: pipeweave" in err
    assert main(["--help"]) == 0


def test_python_dash_m_pipeweave() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "pipeweave", "simulate", "1f1b", "--stages", "4",
         "--microbatches", "8", "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    check_1f1b_p4_m8(json.loads(done.stdout))
