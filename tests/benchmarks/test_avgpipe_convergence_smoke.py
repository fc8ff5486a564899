"""benchmarks/avgpipe_convergence.py --quick: AvgPipe N=1,2,3 vs 1F1B on the same samples."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import avgpipe_convergence as ac  # noqa: E402

B = {"gpt": ac.CASES["gpt"].update_size, "cnn": ac.CASES["cnn"].update_size}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("avgpipe_convergence")
    ac.main(["--quick", "--workers", "1", "--json-out", str(out / "study.json"),
             "--plot-dir", str(out)])
    # What the script wrote is what it computed (plain data through JSON).
    study = json.loads((out / "study.json").read_text())
    study["plots"] = sorted(p.name for p in out.glob("*.png"))
    study["path"] = str(out / "study.json")
    return study


@pytest.mark.timeout(120)
def test_every_method_sees_the_same_samples(study: dict) -> None:
    runs = study["runs"]
    assert len(runs) == 2 * 2 * len(ac.METHODS)  # cases x optimizers x methods, one seed
    for run in runs:
        m = ac.method(run["method"])
        # K batches of B in every run: K/N iterations of N pipelines (or of batches of N*B).
        assert run["samples"] == ac.QUICK_BATCHES * B[run["case"]], run["method"]
        assert run["iterations"] * m.batches_per_iteration == ac.QUICK_BATCHES
        assert run["samples_per_iteration"] == m.batches_per_iteration * B[run["case"]]
        assert len(run["loss_per_pipeline"]) == m.pipelines
        assert all(len(curve) == run["iterations"] for curve in run["loss_per_pipeline"])
        assert run["alpha"] == (1 / m.pipelines if m.schedule == "avgpipe" else None)


@pytest.mark.timeout(120)
def test_losses_and_metrics_are_finite_and_first_batch_agrees(study: dict) -> None:
    for run in study["runs"]:
        values = [v for curve in run["loss_per_pipeline"] for v in curve] + [run["heldout_loss"]]
        assert all(math.isfinite(v) for v in values), run["method"]
        if run["case"] == "cnn":
            assert 0.0 <= run["test_accuracy"] <= 1.0
    for case in ("gpt", "cnn"):
        # Batch 0 meets the same initial weights in pipeline 0 of every B-batch method.
        firsts = {r["loss_per_pipeline"][0][0] for r in study["runs"]
                  if r["case"] == case and ac.method(r["method"]).batch_factor == 1}
        assert max(firsts) == pytest.approx(min(firsts), rel=1e-6)


@pytest.mark.timeout(120)
def test_one_pipeline_is_exactly_1f1b(study: dict) -> None:
    assert ac.check_one_pipeline_is_1f1b(study["runs"]) == 2 * 2  # checked inside run_study too
    for run in study["runs"]:
        if run["method"] == "avgpipe-1":
            (twin,) = [r for r in study["runs"] if r["method"] == "1f1b" and
                       (r["case"], r["optimizer"], r["seed"]) == (run["case"], run["optimizer"], run["seed"])]
            assert run["loss_per_iteration"] == twin["loss_per_iteration"]
            assert run["heldout_loss"] == twin["heldout_loss"]
    tampered = [dict(r) for r in study["runs"]]
    victim = next(r for r in tampered if r["method"] == "avgpipe-1")
    victim["parameters_sha256"] = "0"
    with pytest.raises(AssertionError, match="N=1 parameters differ"):
        ac.check_one_pipeline_is_1f1b(tampered)


@pytest.mark.timeout(120)
def test_table_has_a_row_per_method_and_plots_are_written(study: dict) -> None:
    rows = study["summary"]
    assert len(rows) == 2 * 2 * len(ac.METHODS)
    for row in rows:
        if row["method"] in ("1f1b", "avgpipe-1"):
            assert row["delta_final"] == [0.0, 0.0]
    table = ac.markdown(rows)
    for m in ac.METHODS:
        assert table.count(f"| {m.label} |") == 4, m.label  # 2 cases x 2 optimizers
    assert "test accuracy" in table and "held-out loss" in table
    assert study["plots"] == ["avgpipe_convergence_cnn_samples.png",
                              "avgpipe_convergence_gpt_samples.png"]  # no timing in --quick


@pytest.mark.timeout(60)
def test_reused_runs_give_the_same_summary_and_must_match_the_settings(study: dict) -> None:
    # --reuse-runs (re-time without retraining) takes the runs as they are.
    again = ac.main(["--quick", "--no-timing", "--reuse-runs", study["path"]])
    assert again["runs"] == study["runs"]
    assert json.loads(json.dumps(again["summary"])) == study["summary"]
    with pytest.raises(ValueError, match="saw 192 samples, these settings need 288"):
        ac.main(["--quick", "--no-timing", "--reuse-runs", study["path"], "--batches", "18"])
    with pytest.raises(ValueError, match="lack 24 of the 48"):
        ac.main(["--quick", "--no-timing", "--reuse-runs", study["path"], "--seeds", "0", "1"])


def test_uneven_sample_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of 6"):
        ac.make_job(ac.CASES["gpt"], ac.method("avgpipe-3"), "adam", 0, batches=8)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_timing_run_matches_the_single_process_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ac, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(ac, "RETRIES", 0)
    case, m = ac.CASES["cnn"], ac.method("avgpipe-2")
    timed = ac.time_one(case, m, batches=4)  # 2 iterations of 2 pipelines, + 1 warm-up
    assert timed["steps"] == 3 and timed["ranks"] == 2
    assert timed["samples_per_second"] > 0
    local = ac.train_one(case, m, "adam", 0, 6)  # the same 3 iterations, one process
    assert timed["loss_per_pipeline"] == local["loss_per_pipeline"]
