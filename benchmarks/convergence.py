"""Convergence study: every weight-update semantics, same samples, same seeds, 4 stages.

Run (about 15 minutes on a quiet 2-core machine; ``--quick`` is a < 1 minute smoke version)::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/convergence.py \
        [--quick] [--cases gpt cnn] [--seeds 0 1 2] [--workers 2] [--no-timing] \
        [--json-out benchmarks/results/convergence.json] [--plot-dir docs/img]

Two models: the built-in GPT-tiny (10 blocks, byte-level; 32-token windows) on the standard
library corpus, and the CNN (5 blocks) on the 8x8 digits. Each is cut into P = 4 pipeline stages
(``Plan.uniform``) and trained, float32, by every method below from the same initial weights
(one model seed per run seed) on the same sample sequence:

    gpipe, 1f1b                  synchronous: one update per batch of M micro-batches
    pipedream, pipedream+vs      stashing (+ vertical sync): one update per MICRO-batch
    2bw                          2BW: one update per batch, forward one version behind
    pipeoptim (SGDM/Adam/AdamW)  weight prediction: one update per micro-batch
    spectrain (SGDM)             SGDM prediction: one update per micro-batch
    wpipe                        2GW: one update per batch, first half of the stages one behind
    1f1b (Adam), 1f1b (AdamW)    synchronous baselines for PipeOptim's Adam/AdamW runs

SGD with momentum runs at two learning rates (see ``CASES``): a conservative one and 3x it;
the stale methods' sensitivity to it is the main finding (docs/convergence.md).

What "the same number of updates" means. A per-micro-batch method (PipeDream, PipeOptim,
SpecTrain) steps the optimizer after every micro-batch; a per-batch method (GPipe, 1F1B, 2BW,
WPipe) after every M micro-batches. We fix the UPDATE SIZE ``U`` (samples averaged into one
optimizer step) and the update count ``K`` for every method -- the comparison the papers make
(pipeoptim.txt §V-B compares every method at the same mini-batch per update, GPipe with one
micro-batch as the synchronous baseline):

* per-batch methods: batch ``U`` split into M = 4 micro-batches of ``U/M``; K iterations;
* per-micro-batch methods ("equal-update" geometry): micro-batches of ``U``, batches of
  ``M*U``, ``K/M`` iterations; every update is the optimizer's step on the mean gradient of
  its U samples with the same hyper-parameters, exactly as in the per-batch methods (the
  learning rate means what it means to ``torch.optim`` for the samples one update sees,
  docs/semantics.md).

Every method thus takes K updates of U samples and sees the same ``K*U`` samples in the same
order (per-micro-batch batch j is the concatenation of per-batch batches 4j..4j+3), so at a
given seed loss-vs-updates and loss-vs-samples line up and the curves differ only by the
weight semantics. Because the pipeline shape then differs (bigger micro-batches), the study
also runs the per-micro-batch methods in the "equal-microbatch" geometry: the SAME micro-batch
``U/M`` and batch ``U`` as the per-batch methods with the same optimizer settings, i.e. what
``--schedule pipedream`` does to a synchronous configuration: M times as many updates over the
same samples, each the optimizer's full step (same lr) on the mean gradient of U/M samples.
That geometry appears in the
loss-vs-samples and loss-vs-wall-time plots (dashed), not in loss-vs-updates.

Losses are the training loss of each U-sample group at the weights its forward used (what the
run reports), averaged over seeds; the table's "final loss" is the mean over the last 10 % of
the groups, and "Δ vs sync" the paired (same seed) difference to 1F1B with the same optimizer.
At the end the final parameters (``Job(return_parameters=True)``) are loaded into a fresh model
and evaluated: held-out loss on the corpus' test split (GPT; 256 fixed windows), test loss and
accuracy on the whole digits test split (CNN). A run whose loss becomes non-finite stops (the
runtime raises) and is counted as diverged.

Executors. The loss curves come from the single-process executor ``run_local`` (one process
interprets every rank's program; it gives bit-identical numbers to the multi-process run, which
this script checks on every timing run: ``bit_identical_to_local`` in the JSON), run
``--workers`` at a time, each on one intra-op thread. Wall time comes from ONE multi-process run
per method and geometry (``launch_local``, one process per rank, gloo on the loopback; the 3x-lr
runs do the same work and share their base method's): its steady-state samples/s
(``pipeweave.runtime.observation.summary.summarize``, first iteration excluded) converts samples into
seconds. These runs go first, one at a time, after waiting (briefly) for the CPUs to be quiet.
On 2 cores, 4 ranks share 2 CPUs, so the wall-time axis shows the methods' relative cost on this
machine, not on 4 devices.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import math
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from machine_load import wait_for_quiet
from pipeweave.data import build_dataset
from pipeweave.models import ModelSpec, build_model
from pipeweave.runtime import (
    BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult, iteration_losses,
    launch_local, merged_parameters, run_local,
)
from pipeweave.runtime.observation.summary import summarize

# -- settings -------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "convergence.json"
DEFAULT_PLOTS = ROOT / "docs" / "img"
SEEDS = (0, 1, 2)
DEPTH = 4                 # pipeline stages P (ranks)
MICROBATCHES = 4          # M
WORKERS = 2               # single-process runs in parallel (each uses one intra-op thread)
FINAL_FRACTION = 0.1      # "final loss" = mean over the last 10 % of the U-sample groups
TIMED_BATCHES = 4         # timed iterations of each multi-process run (plus one warm-up)
QUIET_BUSY = 0.3          # wait (up to QUIET_WAIT_S) for others' CPU use below this share
QUIET_WAIT_S = 5.0

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class Case:
    """A model, its data and its training hyper-parameters."""

    key: str
    title: str
    model: str
    dataset: str
    seq_len: int | None
    update_size: int
    """U: samples averaged into one optimizer step, for every method."""
    updates: int
    """K: optimizer steps of the whole model, for every method (a multiple of M)."""
    optimizers: dict[str, tuple[str, dict[str, float]]]
    """``"sgdm" | "sgdm-3x" | "adam" | "adamw"`` -> (torch.optim name, keyword arguments)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    wpipe_depth: int = DEPTH
    """Ranks for WPipe (it needs 2 x depth stages; the CNN has only 5 blocks)."""
    eval_batches: int = 1
    eval_batch_size: int = 359


CASES = {
    # Learning rates. A short sweep of the non-pipelined model (SGDM 0.03-1.0, Adam 1e-3-1e-2)
    # put synchronous training's best at SGDM 0.1-0.3 / Adam 1e-3 (GPT) and SGDM 0.05-0.07 /
    # Adam 3e-3 (CNN, U=32). The stale methods are far more sensitive to the SGDM rate than the
    # synchronous ones (PipeDream + vertical sync and 2BW diverged on GPT at 0.1), so SGDM runs
    # at two rates: "sgdm" (conservative: well inside every method's stable range) and
    # "sgdm-3x" (3x that: near what one would tune for synchronous training).
    "gpt": Case("gpt", "GPT-tiny on the stdlib corpus", "gpt-tiny", "stdlib-bytes", 32,
                update_size=16, updates=96,
                optimizers={"sgdm": ("sgd", {"lr": 0.01, "momentum": 0.9}),
                            "sgdm-3x": ("sgd", {"lr": 0.03, "momentum": 0.9}),
                            "adam": ("adam", {"lr": 1e-3}),
                            "adamw": ("adamw", {"lr": 1e-3, "weight_decay": 0.1})},
                eval_batches=4, eval_batch_size=64),
    # 5 blocks: P = 4 stages [conv0+conv1 | conv2 | fc | head]; WPipe runs 2 ranks x 2 chunks =
    # 4 stages [conv0+conv1 | conv2 ‖ fc | head] (G0 = convs, G1 = fc, head).
    "cnn": Case("cnn", "CNN on 8x8 digits", "cnn", "digits", None,
                update_size=16, updates=288,
                optimizers={"sgdm": ("sgd", {"lr": 0.015, "momentum": 0.9}),
                            "sgdm-3x": ("sgd", {"lr": 0.045, "momentum": 0.9}),
                            "adam": ("adam", {"lr": 3e-3}),
                            "adamw": ("adamw", {"lr": 3e-3, "weight_decay": 0.05})},
                wpipe_depth=2, eval_batches=1, eval_batch_size=359),
}


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    schedule: str
    optimizer: str
    per_microbatch: bool
    """True when the optimizer steps after every micro-batch (no batch-level accumulation)."""
    baseline: str
    """The synchronous method with the same optimizer (for the table's delta column)."""
    options: dict[str, Any] = field(default_factory=dict)
    both_geometries: bool = True
    """Also run the equal-microbatch geometry (per-micro-batch methods only)."""


def _three_x(method: Method) -> Method:
    """The same method at the 3x SGDM learning rate (equal-update geometry only)."""
    return replace(method, key=method.key + "-3x", label=method.label + " 3x lr",
                   optimizer="sgdm-3x", baseline="1f1b-3x", both_geometries=False)


METHODS: tuple[Method, ...] = (
    Method("gpipe", "GPipe", "gpipe", "sgdm", False, "1f1b"),
    Method("1f1b", "1F1B", "1f1b", "sgdm", False, "1f1b"),
    Method("pipedream", "PipeDream", "pipedream", "sgdm", True, "1f1b"),
    Method("pipedream-vs", "PipeDream + vertical sync", "pipedream", "sgdm", True, "1f1b",
           {"vertical_sync": True}),
    Method("2bw", "PipeDream-2BW", "2bw", "sgdm", False, "1f1b"),
    Method("wpipe", "WPipe (2GW)", "wpipe", "sgdm", False, "1f1b"),
    Method("pipeoptim-sgdm", "PipeOptim (SGDM)", "pipeoptim", "sgdm", True, "1f1b"),
    Method("spectrain", "SpecTrain (SGDM)", "spectrain", "sgdm", True, "1f1b"),
    Method("1f1b-adam", "1F1B (Adam)", "1f1b", "adam", False, "1f1b-adam"),
    Method("pipedream-adam", "PipeDream (Adam)", "pipedream", "adam", True, "1f1b-adam"),
    Method("pipeoptim-adam", "PipeOptim (Adam)", "pipeoptim", "adam", True, "1f1b-adam"),
    Method("1f1b-adamw", "1F1B (AdamW)", "1f1b", "adamw", False, "1f1b-adamw"),
    Method("pipeoptim-adamw", "PipeOptim (AdamW)", "pipeoptim", "adamw", True, "1f1b-adamw"),
)
METHODS += tuple(_three_x(m) for m in METHODS
                 if m.key in ("1f1b", "pipedream", "pipedream-vs", "2bw", "wpipe",
                              "pipeoptim-sgdm", "spectrain"))
GEOMETRIES = ("equal-update", "equal-microbatch")


# -- jobs -----------------------------------------------------------------------------------
def grouped_batches(data: BuiltinData, group: int) -> Iterator[Batch]:
    """Batches of ``data`` concatenated ``group`` at a time: batch j = batches gj .. gj+g-1.

    This gives a per-micro-batch method (micro-batch = U) exactly the per-batch methods'
    sample sequence, in the same order.
    """
    stream = iter(data())
    while True:
        parts = list(islice(stream, group))
        yield torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def make_job(case: Case, method: Method, geometry: str, seed: int, *, updates: int,
             num_blocks: int) -> Job:
    """The run of ``method`` with ``updates`` updates of ``case.update_size`` samples each."""
    if updates % MICROBATCHES:
        raise ValueError(f"updates={updates} must be a multiple of M={MICROBATCHES} so that "
                         f"every method ends on a whole batch; use e.g. {updates // MICROBATCHES * MICROBATCHES + MICROBATCHES}")
    grouped = method.per_microbatch and geometry == "equal-update"
    wpipe = method.schedule == "wpipe"
    plan = Plan.uniform(num_blocks, case.wpipe_depth if wpipe else DEPTH, chunks=2 if wpipe else 1,
                        schedule=method.schedule, microbatches=MICROBATCHES,
                        schedule_options=method.options)
    base = BuiltinData(case.dataset, batch_size=case.update_size, seq_len=case.seq_len, seed=seed)
    name, kwargs = case.optimizers[method.optimizer]
    return Job(
        plan=plan, steps=updates // MICROBATCHES if grouped else updates,
        model=BuiltinModel(case.model, seed=seed, overrides=case.overrides),
        data=functools.partial(grouped_batches, base, MICROBATCHES) if grouped else base,
        optimizer=OptimizerFactory(name, kwargs), seed=seed, record_timeline=False,
        return_parameters=True,
    )


def per_update_losses(results: Sequence[RankResult], job: Job, method: Method) -> list[float]:
    """Training loss of every optimizer step's samples, in update order."""
    if not method.per_microbatch:
        return iteration_losses(results, job.plan.microbatches)
    weighted: dict[int, float] = {}
    for result in results:
        weighted.update(result.losses)
    # Each micro-batch's loss is *reported* weighted rows/batch_rows = 1/M (runtime/execution/stage.py).
    return [weighted[j] * job.plan.microbatches for j in sorted(weighted)]


HeldOut = tuple[ModelSpec, torch.nn.Module, list[tuple[Tensor, Tensor]]]
"""What :func:`evaluate` needs besides the parameters: the model spec, a module to load them
into, and the held-out batches."""


def held_out(case: Case, seed: int) -> HeldOut:
    """The evaluation model of ``case`` and its held-out batches: built once, reusable by every
    :func:`evaluate` of the same case and seed (building the model dominates a short one)."""
    spec = build_model(case.model, seed=seed, **case.overrides)
    model = spec.sequential()
    model.eval()
    # The same held-out samples for every method and seed (fixed stream seed).
    stream = build_dataset(case.dataset, batch_size=case.eval_batch_size, seq_len=case.seq_len,
                           seed=12345, split="test")
    return spec, model, list(islice(stream, case.eval_batches))


def evaluate(case: Case, parameters: dict[str, Tensor], seed: int,
             held: HeldOut | None = None) -> dict[str, float]:
    """Held-out loss (and accuracy for classifiers) of the final parameters; ``held``: the
    :func:`held_out` of the same case and seed, when the caller keeps one."""
    spec, model, batches = held or held_out(case, seed)
    model.load_state_dict(parameters, strict=True)
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in batches:
            output = model(inputs)
            total += float(spec.loss_fn(output, targets)) * len(targets)
            if output.dim() == 2:
                correct += int((output.argmax(dim=1) == targets).sum())
            count += len(targets)
    metrics = {"heldout_loss": total / count}
    if case.dataset == "digits":
        metrics["test_accuracy"] = correct / count
    return metrics


def train_one(case: Case, method: Method, geometry: str, seed: int, updates: int) -> dict[str, Any]:
    """One single-process run and its evaluation (runs in a worker process)."""
    num_blocks = len(build_model(case.model, **case.overrides).blocks)
    job = make_job(case, method, geometry, seed, updates=updates, num_blocks=num_blocks)
    started = time.perf_counter()
    try:
        results = run_local(job)
    except FloatingPointError as error:  # the runtime stops at the first non-finite loss
        return {"case": case.key, "method": method.key, "geometry": geometry, "seed": seed,
                "diverged": str(error), "local_seconds": time.perf_counter() - started}
    seconds = time.perf_counter() - started
    by_update = per_update_losses(results, job, method)
    # Group into U-sample groups: batch losses (the runtime's per-iteration mean) for batch-
    # size-U runs, micro-batch losses for the equal-update per-micro-batch runs.
    by_group = (by_update if method.per_microbatch and geometry == "equal-update"
                else iteration_losses(results, job.plan.microbatches))
    return {
        "case": case.key, "method": method.key, "geometry": geometry, "seed": seed,
        "updates": len(by_update),
        "samples_per_update": (case.update_size // MICROBATCHES
                               if method.per_microbatch and geometry != "equal-update"
                               else case.update_size),
        "loss_per_update": by_update, "loss_per_group": by_group,
        "local_seconds": seconds,
        **evaluate(case, merged_parameters(results), seed),
    }


# -- wall time: one multi-process run per method ----------------------------------------------
def time_one(case: Case, method: Method, geometry: str, updates: int) -> dict[str, Any]:
    """Steady-state samples/s of one multi-process run (seed 0), plus its first losses."""
    num_blocks = len(build_model(case.model, **case.overrides).blocks)
    job = make_job(case, method, geometry, 0, updates=updates, num_blocks=num_blocks)
    steps = TIMED_BATCHES + 1
    # Batches made here and shipped to the ranks: no rank re-reads the corpus or scikit-learn.
    batches = tuple(islice(iter(job.data()), steps))
    job = replace(job, steps=steps, data=functools.partial(iter, batches), record_timeline=True,
                  return_parameters=False)
    busy = wait_for_quiet(QUIET_WAIT_S, QUIET_BUSY, sample_s=0.5)
    results = launch_local(job, deadline_s=300)
    summary = summarize(results, schedule=method.schedule, steps=steps,
                        batch_size=int(batches[0][0].shape[0]), microbatches=MICROBATCHES)
    return {
        "case": case.key, "method": method.key, "geometry": geometry,
        "ranks": job.plan.world_size, "steps": steps,
        "samples_per_second": summary.samples_per_second,
        "pipeline_efficiency": summary.pipeline_efficiency, "busy_before": busy,
        "loss_per_update": per_update_losses(results, job, method),
    }


# -- the study --------------------------------------------------------------------------------
def variants(methods: Sequence[Method], geometries: Sequence[str]) -> list[tuple[Method, str]]:
    """(method, geometry) pairs: the equal-microbatch geometry only differs for per-mb methods."""
    return [(m, g) for g in geometries for m in methods
            if g == "equal-update" or (m.per_microbatch and m.both_geometries)]


def run_study(cases: Sequence[Case], methods: Sequence[Method] = METHODS, *,
              seeds: Sequence[int] = SEEDS, geometries: Sequence[str] = GEOMETRIES,
              timing: bool = True, workers: int = WORKERS,
              updates: int | None = None) -> dict[str, Any]:
    """Train every (case, method, geometry, seed); time every (case, method, geometry).

    Returns plain data: ``runs`` (one record per training run), ``timing`` (one per method and
    geometry when ``timing``) and ``settings``.
    """
    for geometry in geometries:
        if geometry not in GEOMETRIES:
            raise ValueError(f"unknown geometry {geometry!r}; choose from {GEOMETRIES}")
    tasks = [(case, method, geometry, seed, updates or case.updates)
             for case in cases for method, geometry in variants(methods, geometries)
             for seed in seeds]
    timings = []
    if timing:  # first, alone on the machine
        for case in cases:
            for method, geometry in variants(methods, geometries):
                if timing_key(method.key) != method.key:
                    continue  # same schedule and work as the base method: timed once
                record = time_one(case, method, geometry, updates or case.updates)
                timings.append(record)
                print(f"  timed {case.key:4} {method.key:16} {geometry:17} "
                      f"{record['samples_per_second']:8.1f} samples/s", flush=True)
    if workers > 1:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(train_one, *task) for task in tasks]
            runs = []
            for future in concurrent.futures.as_completed(futures):
                runs.append(future.result())
                _report(runs[-1], len(runs), len(tasks))
    else:
        runs = []
        for task in tasks:
            runs.append(train_one(*task))
            _report(runs[-1], len(runs), len(tasks))
    runs.sort(key=lambda r: (r["case"], r["method"], r["geometry"], r["seed"]))
    for record in timings:  # the multi-process run repeats the start of the seed-0 run exactly
        match = [r for r in runs if (r["case"], r["method"], r["geometry"], r["seed"])
                 == (record["case"], record["method"], record["geometry"], 0) and "diverged" not in r]
        if match:
            prefix = match[0]["loss_per_update"][:len(record["loss_per_update"])]
            record["bit_identical_to_local"] = prefix == record["loss_per_update"]
    return {
        "settings": {
            "depth": DEPTH, "microbatches": MICROBATCHES, "seeds": list(seeds),
            "geometries": list(geometries), "cases": [asdict(c) for c in cases],
            "methods": [asdict(m) for m in methods], "updates_override": updates,
            "torch": torch.__version__, "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        },
        "runs": runs,
        "timing": timings,
    }


def timing_key(method: str) -> str:
    """The method whose multi-process run times ``method`` (the 3x-lr runs share the base's)."""
    return method.removesuffix("-3x")


def _report(run: dict[str, Any], done: int, total: int) -> None:
    if "diverged" in run:
        print(f"  [{done:3}/{total}] {run['case']:4} {run['method']:16} {run['geometry']:17} "
              f"seed {run['seed']}: DIVERGED ({run['diverged'][:70]})", flush=True)
        return
    extra = f" acc {run['test_accuracy']:.3f}" if "test_accuracy" in run else ""
    print(f"  [{done:3}/{total}] {run['case']:4} {run['method']:16} {run['geometry']:17} "
          f"seed {run['seed']}: final {final_loss(run['loss_per_group']):.3f} "
          f"held-out {run['heldout_loss']:.3f}{extra} ({run['local_seconds']:.1f} s)", flush=True)


def final_loss(groups: Sequence[float]) -> float:
    tail = max(1, round(len(groups) * FINAL_FRACTION))
    return statistics.fmean(groups[-tail:])


# -- tables and plots -------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def smoothed_mean_spread(series: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Each loss series smoothed over 1/12 of its length, then the mean and std across them."""
    curves = [smooth(s, max(1, len(s) // 12)) for s in series]
    return ([statistics.fmean(c) for c in zip(*curves)],
            [statistics.stdev(c) if len(c) > 1 else 0.0 for c in zip(*curves)])


def summary_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (case, method, geometry): means and standard deviations over the seeds
    that did not diverge, and how many did."""
    rows = []
    timing = {(t["case"], t["method"], t["geometry"]): t for t in study["timing"]}
    order = [m.key for m in METHODS]
    keys = sorted({(r["case"], r["method"], r["geometry"]) for r in study["runs"]},
                  key=lambda k: (k[0], GEOMETRIES.index(k[2]), order.index(k[1])))
    for case, method, geometry in keys:
        every = [r for r in study["runs"] if (r["case"], r["method"], r["geometry"]) == (case, method, geometry)]
        runs = [r for r in every if "diverged" not in r]
        settings = next(c for c in study["settings"]["cases"] if c["key"] == case)
        name, kwargs = settings["optimizers"][_method(method).optimizer]
        row: dict[str, Any] = {"case": case, "method": method, "geometry": geometry,
                               "optimizer": f"{name} lr {kwargs['lr']:g}",
                               "seeds": len(every), "diverged": len(every) - len(runs)}
        if runs:
            row["updates"] = runs[0]["updates"]
            row["final_loss"] = mean_std([final_loss(r["loss_per_group"]) for r in runs])
            row["heldout_loss"] = mean_std([r["heldout_loss"] for r in runs])
            if "test_accuracy" in runs[0]:
                row["test_accuracy"] = mean_std([r["test_accuracy"] for r in runs])
        if (case, timing_key(method), geometry) in timing:
            row["samples_per_second"] = timing[case, timing_key(method), geometry]["samples_per_second"]
        # Paired difference to the synchronous baseline with the same optimizer (same seed,
        # same initial weights, same samples).
        baseline = {r["seed"]: r for r in study["runs"] if (r["case"], r["method"], r["geometry"])
                    == (case, _method(method).baseline, "equal-update") and "diverged" not in r}
        deltas = [final_loss(r["loss_per_group"]) - final_loss(baseline[r["seed"]]["loss_per_group"])
                  for r in runs if r["seed"] in baseline]
        if deltas:
            row["delta_vs_sync"] = mean_std(deltas)
        rows.append(row)
    return rows


def _method(key: str) -> Method:
    return next(m for m in METHODS if m.key == key)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as one Markdown table per case."""
    def pm(row: dict[str, Any], key: str, digits: int = 3) -> str:
        if key not in row:
            return "—"
        mean, std = row[key]
        return f"{mean:.{digits}f} ± {std:.{digits}f}"

    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        accuracy = any("test_accuracy" in r for r in rows if r["case"] == case)
        lines += [f"\n**{CASES[case].title if case in CASES else case}**\n",
                  "| method | optimizer | geometry | updates | diverged | final train loss | "
                  "Δ vs sync (paired) | " + ("test loss | test accuracy" if accuracy else "held-out loss")
                  + " | samples/s (4 proc.) |",
                  "|---|---|---|---:|---:|---:|---:|---:|" + ("---:|" if accuracy else "") + "---:|"]
        for r in (r for r in rows if r["case"] == case):
            cells = [_method(r["method"]).label, r["optimizer"], r["geometry"],
                     str(r.get("updates", "—")), f"{r['diverged']}/{r['seeds']}",
                     pm(r, "final_loss"), pm(r, "delta_vs_sync"), pm(r, "heldout_loss")]
            if accuracy:
                cells.append(pm(r, "test_accuracy"))
            cells.append(f"{r['samples_per_second']:.0f}" if "samples_per_second" in r else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


STYLE = {  # colour per method (the 3x-lr runs share their base's); synchronous in black/grey
    "gpipe": ("#888888", ":"), "1f1b": ("#000000", "-"), "pipedream": ("#1f77b4", "-"),
    "pipedream-vs": ("#17becf", "-"), "2bw": ("#ff7f0e", "-"), "wpipe": ("#2ca02c", "-"),
    "pipeoptim-sgdm": ("#d62728", "-"), "spectrain": ("#9467bd", "-"),
    "1f1b-adam": ("#000000", "-"), "pipeoptim-adam": ("#d62728", "-"),
    "pipedream-adam": ("#1f77b4", "-"),
    "1f1b-adamw": ("#777777", "-"), "pipeoptim-adamw": ("#e377c2", "-"),
}


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (shorter at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(study: dict[str, Any], plot_dir: Path) -> list[Path]:
    """Per case: loss vs updates, vs samples and vs wall time; one panel per optimizer family."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing = {(t["case"], t["method"], t["geometry"]): t["samples_per_second"] for t in study["timing"]}
    families = (("sgdm",), ("sgdm-3x",), ("adam", "adamw"))
    written = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for case in dict.fromkeys(r["case"] for r in study["runs"]):
        settings = next(c for c in study["settings"]["cases"] if c["key"] == case)
        update_size = settings["update_size"]
        for axis in ("updates", "samples", "time"):
            if axis == "time" and not timing:
                continue
            figure, panels = plt.subplots(1, 3, figsize=(18, 5.2), sharey=True)
            low, high = math.inf, 0.0
            for panel, family in zip(panels, families):
                for method, geometry in variants(METHODS, GEOMETRIES):
                    every = [r for r in study["runs"] if (r["case"], r["method"], r["geometry"])
                             == (case, method.key, geometry)]
                    runs = [r for r in every if "diverged" not in r]
                    if not runs or method.optimizer not in family:
                        continue
                    if axis == "updates" and geometry != "equal-update":
                        continue  # M x more updates of M x fewer samples: see the samples plot
                    if axis == "time" and (case, timing_key(method.key), geometry) not in timing:
                        continue
                    mean, spread = smoothed_mean_spread([r["loss_per_group"] for r in runs])
                    groups = range(1, len(mean) + 1)
                    xs: list[float] = [float(g) for g in groups]  # updates = U-sample groups
                    if axis in ("samples", "time"):
                        xs = [g * update_size for g in groups]
                    if axis == "time":
                        xs = [x / timing[case, timing_key(method.key), geometry] for x in xs]
                    colour, style = STYLE[timing_key(method.key)]
                    label = method.label.removesuffix(" 3x lr")
                    label += " [equal micro-batch]" if geometry != "equal-update" else ""
                    if len(runs) < len(every):
                        label += f" ({len(every) - len(runs)}/{len(every)} diverged)"
                    panel.plot(xs, mean, color=colour, linewidth=1.4, label=label,
                               linestyle="--" if geometry != "equal-update" else style)
                    panel.fill_between(xs, [m - d for m, d in zip(mean, spread)],
                                       [m + d for m, d in zip(mean, spread)], color=colour, alpha=0.12)
                    low, high = min(low, min(mean)), max(high, mean[0])
                lrs = [settings["optimizers"][f][1]["lr"] for f in family]
                panel.set_title({"sgdm": f"SGD momentum 0.9, lr {lrs[0]:g}",
                                 "sgdm-3x": f"SGD momentum 0.9, lr {lrs[0]:g} (3x)",
                                 "adam": f"Adam / AdamW, lr {lrs[0]:g}"}[family[0]])
                panel.set_xlabel({"updates": f"optimizer updates (each {update_size} samples)",
                                  "samples": "training samples seen",
                                  "time": "wall time (s): 4 processes on a 2-core machine"}[axis])
                panel.grid(alpha=0.3)
                panel.legend(fontsize=7.5, loc="upper right")
            if high > 0:  # diverging curves would squash the rest: clip to the useful range
                panels[0].set_ylim(low - 0.05 * (high - low), high + 0.15 * (high - low))
            panels[0].set_ylabel("training loss (moving average; mean ± std over seeds)")
            figure.suptitle(f"{settings['title']}: loss vs {axis} — P={DEPTH}, M={MICROBATCHES}, "
                            f"{len(study['settings']['seeds'])} seeds")
            figure.tight_layout()
            path = plot_dir / f"convergence_{case}_{axis}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


# -- command line -----------------------------------------------------------------------------
QUICK_UPDATES = 8
ALL_KEYS = [m.key for m in METHODS]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_UPDATES} updates, one seed, no 3x-lr repeats, no multi-process timing")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--methods", nargs="+", default=ALL_KEYS, choices=ALL_KEYS,
                        help="default: all (with --quick: all but the 3x-lr repeats)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--updates", type=int, default=None, help="override every case's K")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--no-timing", action="store_true", help="skip the multi-process runs")
    add_output_arguments(parser, DEFAULT_JSON, DEFAULT_PLOTS)
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    updates = args.updates or (QUICK_UPDATES if args.quick else None)
    methods = [m for m in METHODS if m.key in args.methods
               and not (args.quick and m.optimizer == "sgdm-3x" and args.methods == ALL_KEYS)]
    started = time.perf_counter()
    study = run_study([CASES[c] for c in args.cases], methods, seeds=seeds, updates=updates,
                      timing=not (args.quick or args.no_timing), workers=args.workers)
    study["settings"]["total_seconds"] = time.perf_counter() - started
    rows = summary_rows(study)
    study["summary"] = rows
    print(markdown(rows))
    print(f"\ntotal {study['settings']['total_seconds']:.0f} s")
    write_study(study, args, DEFAULT_JSON, DEFAULT_PLOTS, plot)
    return study


def add_output_arguments(parser: argparse.ArgumentParser, default_json: Path,
                         default_plots: Path) -> None:
    """``--json-out`` and ``--plot-dir``: defaults under the repository, nothing with --quick."""
    parser.add_argument("--json-out", type=Path, default=None,
                        help=f"default {default_json.relative_to(ROOT)} (none with --quick)")
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help=f"default {default_plots.relative_to(ROOT)} (none with --quick)")


def write_study(study: dict[str, Any], args: argparse.Namespace, default_json: Path,
                default_plots: Path, plot: Callable[[dict[str, Any], Path], list[Path]]) -> None:
    """Write the study JSON and its plots where ``add_output_arguments``' options say."""
    json_out = args.json_out or (None if args.quick else default_json)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(study, indent=1) + "\n")
        print(f"wrote {json_out}")
    plot_dir = args.plot_dir or (None if args.quick else default_plots)
    if plot_dir is not None:
        for path in plot(study, plot_dir):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
