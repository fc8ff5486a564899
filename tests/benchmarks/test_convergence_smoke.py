"""benchmarks/convergence.py: every method trains on a tiny setting, on the same samples."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import convergence as cv  # noqa: E402

M = cv.MICROBATCHES
UPDATES = 8

# A 3-layer GPT of width 16 (8 blocks: enough for WPipe's 4 x 2 stages) on 8-token sequences,
# and the real CNN (WPipe on 2 ranks x 2 chunks), both with a few updates.
TINY_GPT = replace(
    cv.CASES["gpt"], overrides={"n_layers": 3, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 8},
    seq_len=8, update_size=8, updates=UPDATES, eval_batches=1, eval_batch_size=16,
    optimizers={"sgdm": ("sgd", {"lr": 0.1, "momentum": 0.9}), "adam": ("adam", {"lr": 1e-2}),
                "adamw": ("adamw", {"lr": 1e-2, "weight_decay": 0.1})})
TINY_CNN = replace(cv.CASES["cnn"], update_size=8, updates=UPDATES, eval_batch_size=64)
# Every schedule x optimizer combination once; the "-3x" entries repeat seven of them at a
# higher SGD learning rate (same code path) and are left out to keep this test short.
BASE = [m for m in cv.METHODS if m.optimizer != "sgdm-3x"]
# PipeDream with vertical sync at SGD-momentum lr 0.1: since the models initialise per module
# (issue 26) this tiny GPT's loss hovers at ln(256) over the 8 stale updates (5.553 -> 5.553)
# instead of going down; it must not go up. docs/convergence.md measures it at length.
HOVERING = {"pipedream-vs"}


@pytest.fixture(scope="module")
def study() -> dict:
    return cv.run_study([TINY_GPT, TINY_CNN], BASE, seeds=[0], timing=False, workers=1)


def runs_of(study: dict, case: str) -> dict[tuple[str, str], dict]:
    return {(r["method"], r["geometry"]): r for r in study["runs"] if r["case"] == case}


def test_every_method_and_geometry_ran(study: dict) -> None:
    expected = {(m.key, "equal-update") for m in BASE} | {
        (m.key, "equal-microbatch") for m in BASE if m.per_microbatch}
    assert len(expected) == 13 + 7
    for case in ("gpt", "cnn"):
        assert set(runs_of(study, case)) == expected


def test_update_and_sample_accounting(study: dict) -> None:
    for case, size in (("gpt", TINY_GPT.update_size), ("cnn", TINY_CNN.update_size)):
        for (method, geometry), run in runs_of(study, case).items():
            # Every run sees UPDATES groups of U samples; only the per-micro-batch methods in
            # the equal-micro-batch geometry update M times per group, with U/M samples each.
            assert len(run["loss_per_group"]) == UPDATES
            more = geometry == "equal-microbatch"
            assert run["updates"] == UPDATES * (M if more else 1), (method, geometry)
            assert run["samples_per_update"] * run["updates"] == UPDATES * size


def test_all_losses_finite_and_gpt_losses_decrease(study: dict) -> None:
    for run in study["runs"]:
        assert "diverged" not in run, run
        assert all(math.isfinite(v) for v in run["loss_per_update"]), run["method"]
        assert math.isfinite(run["heldout_loss"])
    for (method, geometry), run in runs_of(study, "gpt").items():
        groups = run["loss_per_group"]
        # Starts at about ln(256) (uniform over bytes) and goes down. Only where every method
        # takes the same updates: in the equal-micro-batch geometry the per-micro-batch methods
        # take M times as many full-lr steps on M times smaller micro-batches, which this tiny
        # setting's lr of 0.1 does not survive for every stale method (PipeDream + vertical sync).
        if geometry == "equal-update":  # the first group meets the initial weights only
            assert groups[0] == pytest.approx(math.log(256), abs=0.1)
        else:  # M updates already happen inside the first group
            assert groups[0] < math.log(256) + 0.1
        if geometry == "equal-update" and method not in HOVERING:
            assert sum(groups[-2:]) / 2 < groups[0] - 0.05, (method, geometry, groups)
        elif geometry == "equal-update":  # trains, but 8 stale updates barely move it
            assert sum(groups[-2:]) / 2 < groups[0] + 0.05, (method, geometry, groups)


def test_same_initial_weights_and_samples_for_every_method(study: dict) -> None:
    # In the equal-update geometry the first U samples meet the initial weights in every method
    # (no update has happened yet); per-micro-batch methods get them as one micro-batch instead
    # of M, so the first group's loss agrees to float32 rounding, not bit for bit.
    for case in ("gpt", "cnn"):
        firsts = [r["loss_per_group"][0] for (_, geometry), r in runs_of(study, case).items()
                  if geometry == "equal-update"]
        assert len(firsts) == 13
        assert max(firsts) == pytest.approx(min(firsts), rel=1e-5)


def test_synchronous_schedules_agree_and_cnn_is_evaluated(study: dict) -> None:
    for case in ("gpt", "cnn"):
        runs = runs_of(study, case)
        gpipe, one_f_one_b = runs["gpipe", "equal-update"], runs["1f1b", "equal-update"]
        assert gpipe["loss_per_group"] == pytest.approx(one_f_one_b["loss_per_group"], rel=1e-5)
    for run in runs_of(study, "cnn").values():
        assert 0.0 <= run["test_accuracy"] <= 1.0


def test_summary_table_has_a_row_per_method_with_paired_deltas(study: dict) -> None:
    rows = cv.summary_rows(study)
    assert len(rows) == 2 * 20
    for row in rows:
        if row["method"] in ("1f1b", "1f1b-adam", "1f1b-adamw"):
            assert row["delta_vs_sync"] == (0.0, 0.0)
    table = cv.markdown(rows)
    assert table.count("PipeOptim (Adam)") == 4  # 2 cases x 2 geometries


def test_uneven_update_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of M"):
        cv.make_job(TINY_GPT, cv.METHODS[0], "equal-update", 0, updates=6, num_blocks=8)


def test_equal_update_geometry_is_the_same_sgd_when_nothing_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    # With one stage PipeDream has no staleness, so in the equal-update geometry (micro-batch
    # U, the same lr: one update sees U samples either way) it must be plain SGD-momentum on
    # U-sample batches: the same updates as 1F1B with batch U, up to float32 rounding.
    monkeypatch.setattr(cv, "DEPTH", 1)
    methods = {m.key: m for m in cv.METHODS}
    pipedream = cv.train_one(TINY_GPT, methods["pipedream"], "equal-update", 0, UPDATES)
    one_f_one_b = cv.train_one(TINY_GPT, methods["1f1b"], "equal-update", 0, UPDATES)
    assert pipedream["updates"] == one_f_one_b["updates"] == UPDATES
    assert pipedream["loss_per_update"] == pytest.approx(one_f_one_b["loss_per_update"], rel=1e-4)
    assert pipedream["loss_per_update"][-1] < pipedream["loss_per_update"][0] - 0.1
    # The learning rate means the same for every method: no compensation anywhere.
    job = cv.make_job(TINY_GPT, methods["pipedream"], "equal-update", 0, updates=UPDATES, num_blocks=8)
    assert job.optimizer.kwargs["lr"] == 0.1
    adam = cv.make_job(TINY_GPT, methods["pipeoptim-adam"], "equal-update", 0, updates=UPDATES, num_blocks=8)
    assert adam.optimizer.kwargs["lr"] == 1e-2
    same_geometry = cv.make_job(TINY_GPT, methods["pipedream"], "equal-microbatch", 0, updates=UPDATES,
                                num_blocks=8)
    assert same_geometry.optimizer.kwargs["lr"] == 0.1 and same_geometry.steps == UPDATES
