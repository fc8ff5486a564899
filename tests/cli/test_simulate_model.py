"""``pipeweave simulate --profile FILE`` / ``--model NAME``: a schedule timed with a model's
measured costs, split evenly over its stages (cli/cmd_simulate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.profiler import BlockProfile, Profile


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def unit_profile(path: Path, blocks: int = 8) -> Path:
    """Blocks of F = 0.5, B = 1, W = 0.5, 3 MB held: two per stage on 4 stages give the
    zero-bubble papers' unit costs F = I = W = 1, and no link (free transfers)."""
    Profile(tuple(BlockProfile(f"b{i}", 0.5, 1.0, 1e6, 3e6, 1e6, weight_grad=0.5, input_grad=0.5)
                  for i in range(blocks)), model="unit", source="synthetic").save(path)
    return path


@pytest.mark.parametrize("schedule, makespan", [("1f1b", 33.0), ("zb-h1", 27.0)])
def test_a_profile_gives_the_closed_forms(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          schedule: str, makespan: float) -> None:
    code, out, _ = run(capsys, "simulate", schedule, "--stages", "4", "--microbatches", "8",
                       "--profile", str(unit_profile(tmp_path / "p.json")), "--json")
    report = json.loads(out)
    assert code == 0
    assert report["iteration_time"] == pytest.approx(makespan)
    assert report["costs"]["forward"] == pytest.approx([1.0] * 4)
    assert report["costs"]["weight_grad"] == pytest.approx([1.0] * 4)


def test_the_split_follows_the_chunks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """zbv on 2 ranks has 4 stages: two blocks each, the same costs as above."""
    _, out, _ = run(capsys, "simulate", "zbv", "--stages", "2", "--chunks", "2",
                    "--microbatches", "8", "--profile", str(unit_profile(tmp_path / "p.json")),
                    "--json")
    assert json.loads(out)["costs"]["backward"] == pytest.approx([2.0] * 4)


def test_numbers_and_a_profile_are_refused_together(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    code, _, err = run(capsys, "simulate", "1f1b", "--stages", "2", "--microbatches", "4",
                       "--profile", str(unit_profile(tmp_path / "p.json")), "--forward", "2")
    assert code != 0
    assert "--forward and a model's profile both give costs" in err
    assert "Traceback" not in err


def test_more_stages_than_blocks_is_one_line(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    code, _, err = run(capsys, "simulate", "1f1b", "--stages", "4", "--microbatches", "4",
                       "--profile", str(unit_profile(tmp_path / "p.json", blocks=3)))
    assert code != 0 and "fewer than the 4 stages" in err


def test_a_model_is_profiled_now(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "1f1b", "--stages", "2", "--microbatches", "4",
                       "--model", "gpt-tiny", "--json")
    report = json.loads(out)
    assert code == 0 and report["iteration_time"] > 0
    assert len(report["costs"]["forward"]) == 2


def test_without_a_model_the_unit_costs_stay(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "simulate", "1f1b", "--stages", "4", "--microbatches", "8", "--json")
    assert json.loads(out)["iteration_time"] == pytest.approx(33.0)


def test_a_calibrated_action_overhead_is_honoured(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    """A profile whose runtime costs carry ``action_overhead`` (auto --profile-out's, ranks >
    cores): every F and B of 1F1B on 4 stages pays it, and once more where it sends (no
    link: free transfers, so the send is the only message cost)."""
    from dataclasses import replace

    from pipeweave.profiler.runtime_costs import RuntimeCosts

    plain = Profile.load(unit_profile(tmp_path / "p.json"))
    replace(plain, runtime=RuntimeCosts(action_overhead=0.25)).save(tmp_path / "c.json")
    args = ("simulate", "1f1b", "--stages", "4", "--microbatches", "8", "--json", "--profile")
    base = json.loads(run(capsys, *args, str(tmp_path / "p.json"))[1])
    more = json.loads(run(capsys, *args, str(tmp_path / "c.json"))[1])
    assert more["costs"]["forward"] == pytest.approx([1.5, 1.5, 1.5, 1.25])
    assert more["costs"]["backward"] == pytest.approx([2.25, 2.5, 2.5, 2.5])
    assert more["iteration_time"] > base["iteration_time"]


def test_a_slicer_half_is_priced_as_auto_prices_it(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """``sliced-1f1b`` from a profile: a half's F is the blocks at half the micro-batch plus
    the runtime's fixed cost per action (auto/half_costs.py, the same rule as ``auto``), not
    half the whole F: 4 blocks of F = 0.5 per stage and 0.5 per action give F = 2.5 and a
    half 4 x 0.25 + 0.5 = 1.5 where half the whole is 1.25."""
    from dataclasses import replace

    from pipeweave.profiler.runtime_costs import RuntimeCosts

    plain = replace(Profile.load(unit_profile(tmp_path / "p.json")), batch_size=4)
    plain.save(tmp_path / "p4.json")
    replace(plain, runtime=RuntimeCosts(per_action={"forward": 0.5})).save(tmp_path / "c.json")
    args = ("simulate", "sliced-1f1b", "--stages", "2", "--microbatches", "4", "--json",
            "--profile")
    costs = json.loads(run(capsys, *args, str(tmp_path / "c.json"))[1])["costs"]
    assert costs["forward"] == pytest.approx([2.5, 2.5])
    assert costs["half_forward"] == pytest.approx([1.5, 1.5])
    assert costs["half_backward"] == pytest.approx([2.0, 2.0])
    plain_costs = json.loads(run(capsys, *args, str(tmp_path / "p4.json"))[1])["costs"]
    assert plain_costs["half_forward"] == pytest.approx([1.0, 1.0])  # no fixed cost: half
