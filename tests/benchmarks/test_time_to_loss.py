"""benchmarks/time_to_loss.py: the time-to-target arithmetic, and the weight copies its held-out
curves are computed from."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import time_to_loss as ttl  # noqa: E402

from pipeweave.runtime import merged_parameters, run_local  # noqa: E402


def test_first_reach_interpolates_the_first_crossing() -> None:
    xs, losses = [0, 100, 200, 300], [5.0, 4.0, 3.0, 3.5]
    assert ttl.first_reach(xs, losses, 4.0) == 100.0
    assert ttl.first_reach(xs, losses, 3.5) == pytest.approx(150.0)
    assert ttl.first_reach(xs, losses, 3.0) == 200.0
    # the later rise back above the target does not undo the first crossing
    assert ttl.first_reach(xs, losses, 3.2) == pytest.approx(180.0)


def test_first_reach_at_the_start_and_never() -> None:
    assert ttl.first_reach([0, 10], [2.0, 1.0], 3.0) == 0.0
    assert ttl.first_reach([0, 10, 20], [5.0, 4.5, 4.2], 4.0) is None
    # a non-finite point (a diverged evaluation) is never a crossing
    assert ttl.first_reach([0, 10, 20], [5.0, math.nan, 3.0], 4.0) == 20.0
    with pytest.raises(ValueError, match="one loss per x"):
        ttl.first_reach([0, 1], [1.0], 0.5)


def test_ladder_runs_from_the_initial_loss_to_the_final() -> None:
    assert ttl.ladder(5.0, 3.0, (0.5, 1.0)) == [4.0, 3.0]
    assert ttl.ladder(5.0, 3.0)[-1] == 3.0


def test_mean_curve_averages_the_seeds_over_their_common_points() -> None:
    runs = [{"samples": [0, 16, 32], "heldout_loss": [5.0, 4.0, 3.0]},
            {"samples": [0, 16], "heldout_loss": [5.0, 3.0]}]
    assert ttl.mean_curve(runs) == ([0.0, 16.0], [5.0, 3.5])


def _run(method: str, losses: list[float]) -> dict[str, Any]:
    return {"model": "m", "ranks": 4, "method": method, "seed": 0,
            "samples": [0, 100, 200, 300, 400], "heldout_loss": losses}


def test_rows_convert_samples_to_seconds_and_ratio_to_1f1b() -> None:
    study = {
        "runs": [_run("1F1B", [6.0, 5.0, 4.0, 3.0, 2.0]),
                 _run("Fast", [6.0, 5.0, 4.0, 3.0, 2.0]),   # same curve, twice the samples/s
                 _run("Stale", [6.0, 5.5, 5.0, 4.5, 4.0]),  # never reaches 2.0
                 {"model": "m", "ranks": 4, "method": "WPipe", "seed": 0, "skipped": "no"}],
        "timing": [{"model": "m", "ranks": 4, "method": "1F1B", "samples_per_second": 100.0},
                   {"model": "m", "ranks": 4, "method": "Fast", "samples_per_second": 200.0},
                   {"model": "m", "ranks": 4, "method": "Stale", "samples_per_second": 400.0}],
    }
    rows = {r["method"]: r for r in ttl.time_to_loss_rows(study)}
    assert set(rows) == {"1F1B", "Fast", "Stale"}
    assert rows["1F1B"]["targets"] == [4.0, 3.0, 2.4, 2.0]
    assert rows["1F1B"]["samples_to"] == [200.0, 300.0, pytest.approx(360.0), 400.0]
    assert rows["1F1B"]["seconds_to"][-1] == 4.0 and rows["1F1B"]["ratio_to_1f1b"] == 1.0
    assert rows["Fast"]["seconds_to"][-1] == 2.0 and rows["Fast"]["ratio_to_1f1b"] == 0.5
    assert rows["Fast"]["samples_ratio_to_1f1b"] == 1.0 and rows["Fast"]["rate_ratio_to_1f1b"] == 2.0
    assert rows["Stale"]["samples_to"] == [400.0, None, None, None]
    assert rows["Stale"]["seconds_to"][0] == 1.0 and rows["Stale"]["ratio_to_1f1b"] is None
    table = ttl.markdown(list(rows.values()))
    assert ("| Stale | 400 | 4.000 | 1.0 s / 400 | never | never | never | — | 4.00 | "
            "never reached |") in table
    assert ("| Fast | 200 | 2.000 | 1.0 s / 200 | 1.5 s / 300 | 1.8 s / 360 | 2.0 s / 400 | "
            "1.00 | 2.00 | 0.50 |") in table


def test_rows_without_a_timing_keep_samples_and_leave_seconds_out() -> None:
    study = {"runs": [_run("1F1B", [6.0, 5.0, 4.0, 3.0, 2.0])], "timing": []}
    (row,) = ttl.time_to_loss_rows(study)
    assert row["samples_to"][-1] == 400.0 and row["seconds_to"] == [None] * 4
    assert row["ratio_to_1f1b"] is None and "— / 400" in ttl.markdown([row])


TINY = replace(ttl.MODELS["gpt-tiny"], overrides={"n_layers": 2, "d_model": 16, "n_heads": 2,
                                                  "d_ff": 32, "seq_len": 8},
               seq_len=8, update_size=8)


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_snapshots_copy_each_stage_after_its_update(schedule: str) -> None:
    """The copy after the last update is the model the run returns."""
    method = ttl.MethodRow(schedule, schedule, {})
    plan = ttl.make_plan(TINY, method, 2)
    per_batch = ttl.updates_per_batch(plan)
    assert per_batch == (1 if schedule == "1f1b" else plan.microbatches)
    job = replace(ttl.make_job(TINY, plan, 0, 3), return_parameters=True)
    taken: dict[int, dict[str, torch.Tensor]] = {}
    results = run_local(job, features=lambda rank, program: [
        ttl.Snapshots([per_batch, 3 * per_batch], taken)])
    final = merged_parameters(results)
    assert sorted(taken) == [per_batch, 3 * per_batch]
    assert set(taken[3 * per_batch]) == set(final)
    for name, value in final.items():
        assert torch.equal(taken[3 * per_batch][name], value), name
    assert any(not torch.equal(taken[per_batch][n], final[n]) for n in final)


def test_seconds_for_runs_the_warm_up_at_1f1bs_rate() -> None:
    assert ttl.seconds_for(400.0, 200.0, 100.0) == 2.0
    assert ttl.seconds_for(400.0, 200.0, 50.0, sync_samples=100.0) == 2.0 + 1.5
    assert ttl.seconds_for(50.0, 200.0, 100.0, sync_samples=100.0) == 0.5
    assert ttl.seconds_for(None, 200.0, 100.0) is None
    assert ttl.seconds_for(400.0, 200.0, None, sync_samples=100.0) is None


def test_a_correction_row_is_timed_as_its_method_and_the_seeds_spread() -> None:
    """PipeDream+warmup shares PipeDream's samples/s (its first batches at 1F1B's); with three
    seeds each seed is paired with 1F1B's run of the same seed."""
    def run(method: str, seed: int, losses: list[float], **extra: Any) -> dict[str, Any]:
        return {**_run(method, losses), "seed": seed, "batches": 4, **extra}
    study = {
        "runs": [run("1F1B", s, [6.0, 5.0, 4.0, 3.0, 2.0 + 0.1 * s]) for s in range(3)]
        + [run("PipeDream", s, [6.0, 5.0, 4.0, 3.0, 2.0 + 0.3 * s]) for s in range(3)]
        + [run("PipeDream+warmup", 0, [6.0, 5.0, 4.0, 3.0, 2.0], options={"warmup": 1})],
        "timing": [{"model": "m", "ranks": 4, "method": "1F1B", "samples_per_second": 100.0},
                   {"model": "m", "ranks": 4, "method": "PipeDream", "samples_per_second": 200.0}],
    }
    rows = {r["method"]: r for r in ttl.time_to_loss_rows(study)}
    warm = rows["PipeDream+warmup"]
    assert warm["samples_per_second"] == 200.0 and warm["seeds"] == 1
    assert warm["seconds_to"] == [None] * 4  # the warm-up's own rate not measured: no time
    study["timing"].append({"model": "m", "ranks": 4, "method": "PipeDream+warmup",
                            "samples_per_second": 50.0})
    rows = {r["method"]: r for r in ttl.time_to_loss_rows(study)}
    warm = rows["PipeDream+warmup"]
    assert warm["samples_per_second"] == 200.0 and warm["warmup_samples_per_second"] == 50.0
    # 1F1B's seed-mean final is 2.1, reached at 390 samples: 100 in the warm-up at its own
    # 50/s, 290 at PipeDream's 200/s
    assert warm["seconds_to"][-1] == pytest.approx(2.0 + 290.0 / 200.0)
    assert rows["PipeDream"]["ratio_per_seed"][0] == 0.5
    assert rows["PipeDream"]["ratio_per_seed"][1:] == [None, None]  # above 1F1B's seed's final
    assert rows["1F1B"]["ratio_per_seed"] == [1.0, 1.0, 1.0]
    table = ttl.markdown(list(rows.values()))
    assert "| 1.00 (1.00–1.00; 3 seeds) |" in table
    assert "2.300 (2.000–2.600; 3 seeds)" in table and "(0.50–0.50, 2 never; 3 seeds)" in table


def test_optimizer_of_swaps_adam_for_nadam_only() -> None:
    nadam = ttl.MethodRow("x", "pipedream", {"nesterov": 0.99}, "nadam")
    assert ttl.optimizer_of(ttl.MODELS["gpt-tiny"], nadam) == ("nadam", {"lr": 1e-3})
    assert ttl.optimizer_of(ttl.MODELS["cnn"], ttl.METHODS[0])[0] == "sgd"
    with pytest.raises(ValueError, match="replaces Adam only"):
        ttl.optimizer_of(ttl.MODELS["cnn"], nadam)


def test_eval_points_end_at_the_last_batch() -> None:
    assert ttl.eval_points(24, 8) == [8, 16, 24]
    assert ttl.eval_points(4, 3) == [3, 4]
    assert ttl.eval_points(2, 5) == [2]


def test_the_evaluator_gives_convergence_evaluates_numbers() -> None:
    """Built once per (model, seed), the same held-out loss as a fresh evaluate."""
    from convergence import evaluate
    evaluator = ttl.Evaluator()
    initial = ttl.build_model(TINY.model, seed=1, **TINY.overrides).materialized("cpu")
    weights = dict(initial.sequential().state_dict())
    assert evaluator(TINY, None, 1) == evaluate(TINY, weights, 1)
    moved = {name: value + 0.01 for name, value in weights.items()}
    assert evaluator(TINY, moved, 1) == evaluate(TINY, moved, 1)
    assert evaluator(TINY, moved, 1) != evaluator(TINY, None, 1)
    assert list(evaluator.held) == [(TINY.key, 1)] and list(evaluator.initial) == [(TINY.key, 1)]


@pytest.mark.parametrize("schedule", sorted(ttl.RANK_FREE))
def test_a_rank_free_methods_curve_is_the_same_at_every_p(schedule: str) -> None:
    """Why one 1F1B / 2BW run serves P = 2 and 4 (the study copies it): bit for bit equal."""
    method = ttl.MethodRow(schedule, schedule, {})
    two, four = (ttl.train(TINY, method, p, 0, 3, 1) for p in (2, 4))
    assert two["heldout_loss"] == four["heldout_loss"] and two["train_loss"] == four["train_loss"]
    assert ttl._same_at_other_ranks([two], TINY.key, method, 0, 3) is two
    assert ttl._same_at_other_ranks([two], TINY.key, method, 1, 3) is None
    stale = ttl.MethodRow("PipeDream", "pipedream", {})
    assert ttl._same_at_other_ranks([{**two, "method": "PipeDream"}], TINY.key, stale, 0, 3) is None


def test_merge_adds_only_what_the_study_lacks() -> None:
    study = {"runs": [_run("1F1B", [6.0, 2.0]) | {"batches": 4}],
             "timing": [{"model": "m", "ranks": 4, "method": "1F1B", "samples_per_second": 1.0}]}
    part = {"runs": [_run("1F1B", [9.0, 9.0]) | {"batches": 4},
                     _run("PipeDream", [6.0, 3.0]) | {"batches": 4}],
            "timing": [{"model": "m", "ranks": 4, "method": "1F1B", "samples_per_second": 2.0},
                       {"model": "m", "ranks": 4, "method": "PipeDream", "repeats": []},
                       {"model": "m", "ranks": 2, "method": "1F1B", "samples_per_second": 3.0}]}
    assert ttl.merge(study, part) == 2
    assert [r["method"] for r in study["runs"]] == ["1F1B", "PipeDream"]
    assert study["runs"][0]["heldout_loss"] == [6.0, 2.0]
    assert [t["samples_per_second"] for t in study["timing"]] == [1.0, 3.0]
    assert ttl.merge(study, part) == 0
