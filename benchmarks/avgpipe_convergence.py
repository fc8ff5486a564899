"""Convergence study: AvgPipe (N = 2, 3 parallel pipelines) vs synchronous 1F1B, same samples.

Run (about 20 minutes on a 2-core machine: 14 training, 7 timing; ``--quick``: < 1 minute)::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_convergence.py \
        [--quick] [--cases gpt cnn] [--optimizers adam sgdm-3x] [--seeds 0 1 2] \
        [--batches K] [--workers 2] [--no-timing] [--repeats 3] [--reuse-runs STUDY.json] \
        [--json-out benchmarks/results/avgpipe_convergence.json] [--plot-dir docs/img]

``--reuse-runs`` takes the training runs from an earlier study's JSON (same settings) and only
redoes the wall-time measurements.

The models, data, learning rates and evaluation are ``benchmarks/convergence.py``'s (imported,
not copied): GPT-tiny (byte-level, 32-token windows) on the standard-library corpus and the CNN
on the 8x8 digits, each cut into P = 2 stages (``Plan.uniform``), M = 4 micro-batches per
batch, float32, Adam and SGD with momentum 0.9 at convergence.py's "3x" rate (nothing here is
stale, so the rate near synchronous training's best; for the CNN at B = 16 it is on the high
side: 1F1B plateaus, see docs/convergence.md). No rate is retuned per method.

Methods (avgpipe.txt §3.2; ``Plan.pipelines = N``, ``Plan.semantics.alpha = 1/N``)::

    1f1b          synchronous 1F1B: one batch of B samples per iteration
    avgpipe-1     AvgPipe with N = 1: must be 1F1B bit for bit (checked on every run)
    avgpipe-2/3   N parallel pipelines on the same 2 ranks, each on its own batch of B; each
                  takes its own optimizer step, is pulled toward the reference model by
                  alpha = 1/N, and the reference becomes the mean of the N models
    1f1b-2b/3b    synchronous 1F1B on batches of N*B (the same lr): what averaging the N
                  pipelines' updates resembles, for reading the AvgPipe rows

What "the same total samples" means. Every method sees the same K batches of B samples
(``--batches K``, a multiple of 6), in the same order, from the same initial weights (one
model and data seed per run seed). The runtime gives pipeline ``p`` of iteration ``k`` batch
``k*N + p`` of the stream (runtime/execution/microbatches.py), so AvgPipe with N pipelines runs K/N
iterations; 1F1B on batches of N*B gets batch j = the concatenation of batches Nj..Nj+N-1
(``convergence.grouped_batches``) and also runs K/N iterations. Every run therefore consumes
``K*B`` samples, and the parallel models of AvgPipe take K/N optimizer steps each.

Loss. The last stage reports each micro-batch's loss per pipeline (``RankResult.losses`` for
pipeline 0, ``RankResult.pipeline_losses[p]`` for p >= 1; the summary's ``iteration_losses``
covers pipeline 0 only). The curves plot, per iteration, the mean over the N pipelines of
their batch losses (each at the weights of the parallel model that ran it) against the samples
seen so far, ``(k+1)*N*B``. "Final train loss" is the mean over the last 10 % of the samples;
"Δ vs 1F1B" the paired (same seed) difference. At the end the parameters the runtime returns
(``Job(return_parameters=True)``: for AvgPipe the REFERENCE model, the one the paper evaluates;
the model itself otherwise) are evaluated as in convergence.py: held-out loss on 256 fixed
windows of the corpus' test split (GPT), test loss and accuracy on the digits test split (CNN).
"Samples to target" / "time to target": where the seed-mean smoothed curve first reaches 1F1B's
smoothed loss at half of its samples.

Wall time. Short multi-process runs per method and case (``launch_local``: 2 ranks, gloo on
the loopback, one intra-op thread each; Adam; the SGD runs do the same work and share them) of
``TIMED_BATCHES`` batches plus a warm-up iteration, each after waiting for the CPUs to be
quiet and redone (up to ``RETRIES`` times) when processes outside the benchmark took more than
``MAX_FOREIGN`` of the CPUs meanwhile (vs_torch_pipelining.py's protocol, imported, with
fewer retries: the repeats below already absorb the odd disturbed run). On this
shared 2-core machine one run is not enough (two runs of the same work differed by 1.5x in a
first attempt), so every method runs ``--repeats`` times, round-robin over the methods so that
slow drifts hit all of them alike, and the median of the steady-state samples/s
(``pipeweave.runtime.observation.summary.summarize``, first iteration excluded) converts samples into
seconds. Their losses are checked bit for bit against the start of the seed-0 single-process
run (``bit_identical_to_local``). The loss curves come from the single-process executor
``run_local`` (same numbers), ``--workers`` at a time, after the timing runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convergence as cv  # noqa: E402
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from vs_torch_pipelining import MAX_FOREIGN  # noqa: E402

from pipeweave.models import build_model  # noqa: E402
from pipeweave.runtime import (  # noqa: E402
    BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult, launch_local,
    merged_parameters, run_local,
)
from pipeweave.runtime.observation.summary import summarize  # noqa: E402

# -- settings -------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "avgpipe_convergence.json"
DEFAULT_PLOTS = ROOT / "docs" / "img"
SEEDS = (0, 1, 2)
DEPTH = 2                 # pipeline stages P (ranks)
MICROBATCHES = 4          # M, per pipeline and batch
WORKERS = 2               # single-process runs in parallel (each on one intra-op thread)
OPTIMIZERS = ("adam", "sgdm-3x")   # keys of convergence.CASES[...].optimizers
TIMED_BATCHES = 48        # batches of B per timing run (K/N iterations), plus one warm-up iteration
REPEATS = 3               # timing runs per method and case; the median samples/s is used
QUIET_WAIT_S = 15.0       # before each timing run, wait up to this long for quiet CPUs
RETRIES = 1               # redo a run disturbed by other processes at most this often
TARGET_FRACTION = 0.5     # target loss: 1F1B's smoothed loss at this fraction of its samples
QUICK_BATCHES = 12
# K batches of B = 16 samples per case: 4x convergence.py's GPT run, 2x its CNN run (~6 epochs
# of the 1,438 training digits); both multiples of 6 (N = 2 and 3 end on whole iterations).
CASES: dict[str, cv.Case] = {
    "gpt": replace(cv.CASES["gpt"], updates=384),
    "cnn": replace(cv.CASES["cnn"], updates=576),
}
"""``Case.updates`` is K here: 1F1B's iterations, i.e. the batches of B every method consumes."""


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    schedule: str
    pipelines: int
    """N: parallel pipelines, each on its own batch per iteration (AvgPipe)."""
    batch_factor: int = 1
    """Batches of B concatenated into one (the large-batch synchronous baselines)."""

    @property
    def batches_per_iteration(self) -> int:
        return self.pipelines * self.batch_factor

    @property
    def alpha(self) -> float | None:
        return 1.0 / self.pipelines if self.schedule == "avgpipe" else None


METHODS: tuple[Method, ...] = (
    Method("1f1b", "1F1B", "1f1b", 1),
    Method("avgpipe-1", "AvgPipe N=1", "avgpipe", 1),
    Method("avgpipe-2", "AvgPipe N=2 (α=1/2)", "avgpipe", 2),
    Method("avgpipe-3", "AvgPipe N=3 (α=1/3)", "avgpipe", 3),
    Method("1f1b-2b", "1F1B, batch 2B", "1f1b", 1, 2),
    Method("1f1b-3b", "1F1B, batch 3B", "1f1b", 1, 3),
)
METHOD_KEYS = [m.key for m in METHODS]


def method(key: str) -> Method:
    return next(m for m in METHODS if m.key == key)


# -- jobs -----------------------------------------------------------------------------------
def num_blocks(case: cv.Case) -> int:
    return len(build_model(case.model, **case.overrides).blocks)


def make_job(case: cv.Case, m: Method, optimizer: str, seed: int, *, batches: int) -> Job:
    """``m`` trained on the first ``batches`` batches of ``case.update_size`` samples."""
    if batches % m.batches_per_iteration:
        raise ValueError(f"batches={batches} is not a multiple of the {m.batches_per_iteration} "
                         f"batches {m.key} takes per iteration; use a multiple of 6 "
                         f"(e.g. {batches // 6 * 6 + 6}) so that every method ends on a whole iteration")
    semantics = {"alpha": m.alpha} if m.alpha is not None else {}
    plan = Plan.uniform(num_blocks(case), DEPTH, schedule=m.schedule, microbatches=MICROBATCHES,
                        pipelines=m.pipelines, semantics=semantics)
    base = BuiltinData(case.dataset, batch_size=case.update_size, seq_len=case.seq_len, seed=seed)
    name, kwargs = case.optimizers[optimizer]
    return Job(
        plan=plan, steps=batches // m.batches_per_iteration,
        model=BuiltinModel(case.model, seed=seed, overrides=case.overrides),
        data=functools.partial(cv.grouped_batches, base, m.batch_factor) if m.batch_factor > 1 else base,
        optimizer=OptimizerFactory(name, kwargs), seed=seed, record_timeline=False,
        return_parameters=True,
    )


def pipeline_losses(results: Sequence[RankResult], pipelines: int) -> list[list[float]]:
    """Per pipeline, the mean training loss of each iteration's batch.

    The last stage records every micro-batch's loss weighted by rows/batch rows (1/M here), so
    an iteration's batch loss is the sum over its M micro-batches ``j // M == k``.
    """
    curves = []
    for p in range(pipelines):
        weighted: dict[int, float] = {}
        for result in results:
            weighted.update(result.losses if p == 0 else result.pipeline_losses.get(p, {}))
        sums = [0.0] * (max(weighted) // MICROBATCHES + 1)
        for j, value in sorted(weighted.items()):
            sums[j // MICROBATCHES] += value
        curves.append(sums)
    return curves


def fingerprint(parameters: dict[str, Tensor]) -> str:
    """SHA-256 of the parameters' bytes (to check "bit for bit" without storing weights)."""
    digest = hashlib.sha256()
    for name in sorted(parameters):
        digest.update(name.encode())
        digest.update(parameters[name].detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_one(case: cv.Case, m: Method, optimizer: str, seed: int, batches: int) -> dict[str, Any]:
    """One single-process run and the evaluation of the model it returns (reference model)."""
    torch.set_num_threads(1)
    job = make_job(case, m, optimizer, seed, batches=batches)
    started = time.perf_counter()
    results = run_local(job)
    seconds = time.perf_counter() - started
    per_pipeline = pipeline_losses(results, m.pipelines)
    parameters = merged_parameters(results)
    return {
        "case": case.key, "method": m.key, "optimizer": optimizer, "seed": seed,
        "pipelines": m.pipelines, "alpha": m.alpha, "iterations": job.steps,
        "samples_per_iteration": m.batches_per_iteration * case.update_size,
        "samples": job.steps * m.batches_per_iteration * case.update_size,
        "loss_per_pipeline": per_pipeline,
        "loss_per_iteration": [statistics.fmean(v) for v in zip(*per_pipeline)],
        "parameters_sha256": fingerprint(parameters),
        "local_seconds": seconds,
        **cv.evaluate(case, parameters, seed),
    }


# -- wall time: one multi-process run per method ----------------------------------------------
def time_one(case: cv.Case, m: Method, optimizer: str = "adam",
             batches: int = TIMED_BATCHES) -> dict[str, Any]:
    """Steady-state samples/s of one 2-process run (seed 0), and its losses."""
    job = make_job(case, m, optimizer, 0, batches=batches)
    steps = job.steps + 1  # + one warm-up iteration, not timed
    # Batches made here and shipped to the ranks: no rank re-reads the corpus or scikit-learn.
    shipped = tuple(islice(iter(job.data()), steps * m.pipelines))
    job = replace(job, steps=steps, data=functools.partial(iter, shipped), record_timeline=True,
                  return_parameters=False)
    for attempt in range(1, RETRIES + 2):
        busy = wait_for_quiet(QUIET_WAIT_S)
        with ForeignLoad() as load:
            results = launch_local(job, deadline_s=300)
        if load.share <= MAX_FOREIGN:
            break
    summary = summarize(results, schedule=m.schedule, steps=steps,
                        batch_size=int(shipped[0][0].shape[0]), microbatches=MICROBATCHES,
                        pipelines=m.pipelines)
    return {
        "case": case.key, "method": m.key, "optimizer": optimizer, "ranks": job.plan.world_size,
        "steps": steps, "samples_per_second": summary.samples_per_second,
        "pipeline_efficiency": summary.pipeline_efficiency, "busy_before": busy,
        "foreign": load.share, "attempts": attempt,
        "loss_per_pipeline": pipeline_losses(results, m.pipelines),
    }


def time_all(cases: Sequence[cv.Case], methods: Sequence[Method], repeats: int) -> list[dict[str, Any]]:
    """``repeats`` timing runs per (case, method), round-robin; one record per (case, method)
    with the median samples/s and every repeat."""
    measured: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for repeat in range(repeats):
        for case in cases:
            for m in methods:
                record = time_one(case, m)
                measured.setdefault((case.key, m.key), []).append(record)
                print(f"  timed {case.key:4} {m.key:10} run {repeat + 1}/{repeats}: "
                      f"{record['samples_per_second']:7.1f} samples/s (busy before "
                      f"{record['busy_before']:.2f}, foreign {record['foreign']:.2f}, "
                      f"attempts {record['attempts']})", flush=True)
    timings = []
    for (case_key, key), records in measured.items():
        speeds = [r["samples_per_second"] for r in records]
        timings.append({
            "case": case_key, "method": key, "optimizer": records[0]["optimizer"],
            "samples_per_second": statistics.median(speeds), "repeats": speeds,
            "pipeline_efficiency": statistics.median(r["pipeline_efficiency"] for r in records),
            "runs": records,
        })
    return timings


# -- the study --------------------------------------------------------------------------------
def run_study(cases: Sequence[cv.Case], methods: Sequence[Method] = METHODS, *,
              optimizers: Sequence[str] = OPTIMIZERS, seeds: Sequence[int] = SEEDS,
              batches: int | None = None, timing: bool = True, repeats: int = REPEATS,
              workers: int = WORKERS, reuse: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Train every (case, method, optimizer, seed); time every (case, method).

    ``reuse``: training runs of an earlier study to take instead of training (they must cover
    exactly these settings). Returns plain data: ``runs``, ``timing`` and ``settings``. Raises
    ``AssertionError`` if AvgPipe with N = 1 differs from 1F1B in any loss or parameter bit.
    """
    tasks = [(case, m, optimizer, seed, batches or case.updates)
             for case in cases for optimizer in optimizers for m in methods for seed in seeds]
    for case, m, optimizer, _, k in tasks:  # reject a bad K before anything runs
        make_job(case, m, optimizer, 0, batches=k)
    timings = time_all(cases, methods, repeats) if timing else []  # first, alone on the machine
    runs: list[dict[str, Any]] = []
    if reuse is not None:
        runs = reused_runs(reuse, tasks)
    elif workers > 1:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(train_one, *task) for task in tasks]
            for future in concurrent.futures.as_completed(futures):
                runs.append(future.result())
                _report(runs[-1], len(runs), len(tasks))
    else:
        for task in tasks:
            runs.append(train_one(*task))
            _report(runs[-1], len(runs), len(tasks))
    order = [c.key for c in cases]
    runs.sort(key=lambda r: (order.index(r["case"]), list(optimizers).index(r["optimizer"]),
                             METHOD_KEYS.index(r["method"]), r["seed"]))
    check_one_pipeline_is_1f1b(runs)
    for record in timings:  # the multi-process run repeats the start of the seed-0 run exactly
        match = [r for r in runs if (r["case"], r["method"], r["optimizer"], r["seed"])
                 == (record["case"], record["method"], record["optimizer"], 0)]
        if match:
            record["bit_identical_to_local"] = all(
                local[:len(timed)] == timed for one in record["runs"]
                for local, timed in zip(match[0]["loss_per_pipeline"], one["loss_per_pipeline"]))
    return {
        "settings": {
            "depth": DEPTH, "microbatches": MICROBATCHES, "seeds": list(seeds),
            "optimizers": list(optimizers), "batches_override": batches,
            "cases": [asdict(c) for c in cases], "methods": [asdict(m) for m in methods],
            "timed_batches": TIMED_BATCHES, "timing_repeats": repeats if timing else 0,
            "target_fraction": TARGET_FRACTION,
            "final_fraction": cv.FINAL_FRACTION,
            "torch": torch.__version__, "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        },
        "runs": runs,
        "timing": timings,
    }


def reused_runs(reuse: Sequence[dict[str, Any]],
                tasks: Sequence[tuple[cv.Case, Method, str, int, int]]) -> list[dict[str, Any]]:
    """The earlier study's run for every task; each must exist and have the task's samples."""
    stored = {(r["case"], r["method"], r["optimizer"], r["seed"]): r for r in reuse}
    wanted = {(c.key, m.key, o, seed): batches * c.update_size for c, m, o, seed, batches in tasks}
    missing = sorted(set(wanted) - set(stored))
    if missing:
        raise ValueError(f"the runs to reuse lack {len(missing)} of the {len(wanted)} (case, method, "
                         f"optimizer, seed) runs these settings need, e.g. {missing[0]}; train "
                         f"them (leave out --reuse-runs) or pass the settings of the earlier study")
    other = sorted(k for k, samples in wanted.items() if stored[k]["samples"] != samples)
    if other:
        key = other[0]
        raise ValueError(f"the run to reuse {key} saw {stored[key]['samples']} samples, these "
                         f"settings need {wanted[key]}; pass the earlier study's --batches")
    return [stored[k] for k in wanted]


def check_one_pipeline_is_1f1b(runs: Sequence[dict[str, Any]]) -> int:
    """AvgPipe with N = 1 must be 1F1B exactly (averaging with alpha = 1 toward itself is a
    no-op; runtime/execution/elastic_averaging.py): same losses and parameters, bit for bit. Returns the number
    of pairs checked."""
    baseline = {(r["case"], r["optimizer"], r["seed"]): r for r in runs if r["method"] == "1f1b"}
    checked = 0
    for run in (r for r in runs if r["method"] == "avgpipe-1"):
        key = (run["case"], run["optimizer"], run["seed"])
        if key not in baseline:
            continue
        other = baseline[key]
        assert run["loss_per_iteration"] == other["loss_per_iteration"], f"N=1 losses differ: {key}"
        assert run["parameters_sha256"] == other["parameters_sha256"], f"N=1 parameters differ: {key}"
        checked += 1
    return checked


def _report(run: dict[str, Any], done: int, total: int) -> None:
    extra = f" acc {run['test_accuracy']:.3f}" if "test_accuracy" in run else ""
    print(f"  [{done:3}/{total}] {run['case']:4} {run['optimizer']:8} {run['method']:10} "
          f"seed {run['seed']}: final {final_loss(run['loss_per_iteration']):.3f} "
          f"held-out {run['heldout_loss']:.3f}{extra} ({run['local_seconds']:.1f} s)", flush=True)


def final_loss(curve: Sequence[float]) -> float:
    """Mean over the last 10 % of the iterations (= of the samples: iterations are equal)."""
    return cv.final_loss(curve)


# -- summaries ----------------------------------------------------------------------------------
def mean_curve(runs: Sequence[dict[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """Samples seen after each iteration, and the seed mean and std of the smoothed loss.

    The moving-average window is 1/12 of the run in iterations, i.e. the same number of samples
    for every method (they all see the same samples)."""
    mean, spread = cv.smoothed_mean_spread([r["loss_per_iteration"] for r in runs])
    step = runs[0]["samples_per_iteration"]
    xs = [float((k + 1) * step) for k in range(len(mean))]
    return xs, mean, spread


def samples_to(target: float, xs: Sequence[float], curve: Sequence[float]) -> float | None:
    return next((x for x, y in zip(xs, curve) if y <= target), None)


def summary_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (case, optimizer, method): means and standard deviations over the seeds."""
    rows = []
    timing = {(t["case"], t["method"]): t["samples_per_second"] for t in study["timing"]}
    keys = list(dict.fromkeys((r["case"], r["optimizer"], r["method"]) for r in study["runs"]))
    for case, optimizer, key in keys:
        runs = [r for r in study["runs"] if (r["case"], r["optimizer"], r["method"]) == (case, optimizer, key)]
        settings = next(c for c in study["settings"]["cases"] if c["key"] == case)
        name, kwargs = settings["optimizers"][optimizer]
        row: dict[str, Any] = {
            "case": case, "optimizer": optimizer, "optimizer_label": f"{name} lr {kwargs['lr']:g}",
            "method": key, "seeds": len(runs), "batch_size": settings["update_size"],
            "iterations": runs[0]["iterations"],
            "samples_per_iteration": runs[0]["samples_per_iteration"], "samples": runs[0]["samples"],
            "final_loss": cv.mean_std([final_loss(r["loss_per_iteration"]) for r in runs]),
            "heldout_loss": cv.mean_std([r["heldout_loss"] for r in runs]),
        }
        if "test_accuracy" in runs[0]:
            row["test_accuracy"] = cv.mean_std([r["test_accuracy"] for r in runs])
        baseline = {r["seed"]: r for r in study["runs"]
                    if (r["case"], r["optimizer"], r["method"]) == (case, optimizer, "1f1b")}
        paired = [r for r in runs if r["seed"] in baseline]
        if paired:  # same seed: same initial weights and samples
            row["delta_final"] = cv.mean_std([final_loss(r["loss_per_iteration"])
                                               - final_loss(baseline[r["seed"]]["loss_per_iteration"])
                                               for r in paired])
            row["delta_heldout"] = cv.mean_std([r["heldout_loss"] - baseline[r["seed"]]["heldout_loss"]
                                                 for r in paired])
            base_xs, base_mean, _ = mean_curve([baseline[r["seed"]] for r in paired])
            target = base_mean[max(0, round(len(base_mean) * TARGET_FRACTION) - 1)]
            xs, mean, _ = mean_curve(runs)
            row["target_loss"] = target
            row["samples_to_target"] = samples_to(target, xs, mean)
        if (case, key) in timing:
            speed = timing[case, key]
            row["samples_per_second"] = speed
            row["train_seconds"] = row["samples"] / speed
            if row.get("samples_to_target") is not None:
                row["seconds_to_target"] = row["samples_to_target"] / speed
        rows.append(row)
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as one Markdown table per case."""
    def pm(row: dict[str, Any], key: str, digits: int = 3) -> str:
        if key not in row:
            return "—"
        mean, std = row[key]
        return f"{mean:.{digits}f} ± {std:.{digits}f}"

    def number(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        if value is not None:
            return format(value, fmt)
        reached = "target_loss" not in row or row.get("samples_to_target") is not None
        timed = key != "seconds_to_target" or "samples_per_second" in row
        return "not reached" if key.endswith("_to_target") and timed and not reached else "—"

    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        accuracy = any("test_accuracy" in r for r in rows if r["case"] == case)
        title = CASES[case].title if case in CASES else case
        batch = next(r["batch_size"] for r in rows if r["case"] == case)
        lines += [f"\n**{title}** (P = {DEPTH}, M = {MICROBATCHES}, B = {batch} samples per "
                  f"batch of a pipeline)\n",
                  "| method | optimizer | iterations × samples | final train loss | Δ vs 1F1B (paired) | "
                  + ("test loss | test accuracy" if accuracy else "held-out loss")
                  + " | Δ " + ("test" if accuracy else "held-out") + " loss vs 1F1B"
                  + " | samples to target | samples/s (2 proc.) | s to target | s for all samples |",
                  "|---|---|---:|---:|---:|---:|" + ("---:|" if accuracy else "")
                  + "---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["case"] == case):
            cells = [method(r["method"]).label, r["optimizer_label"],
                     f"{r['iterations']} × {r['samples_per_iteration']}",
                     pm(r, "final_loss"), pm(r, "delta_final"), pm(r, "heldout_loss")]
            if accuracy:
                cells.append(pm(r, "test_accuracy"))
            cells += [pm(r, "delta_heldout"), number(r, "samples_to_target", ".0f"),
                      number(r, "samples_per_second", ".0f"), number(r, "seconds_to_target", ".1f"),
                      number(r, "train_seconds", ".1f")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------------------
STYLE = {  # colour, line style; N=1 is drawn thin (it lies on 1F1B)
    "1f1b": ("#000000", "-"), "avgpipe-1": ("#bbbbbb", ":"),
    "avgpipe-2": ("#1f77b4", "-"), "avgpipe-3": ("#d62728", "-"),
    "1f1b-2b": ("#1f77b4", "--"), "1f1b-3b": ("#d62728", "--"),
}


def plot(study: dict[str, Any], plot_dir: Path) -> list[Path]:
    """Per case: loss vs samples and vs wall time, one panel per optimizer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing = {(t["case"], t["method"]): t["samples_per_second"] for t in study["timing"]}
    optimizers = study["settings"]["optimizers"]
    written = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for case in dict.fromkeys(r["case"] for r in study["runs"]):
        settings = next(c for c in study["settings"]["cases"] if c["key"] == case)
        for axis in ("samples", "time"):
            if axis == "time" and not timing:
                continue
            figure, panels = plt.subplots(1, len(optimizers), figsize=(7.5 * len(optimizers), 5),
                                          sharey=False, squeeze=False)
            for panel, optimizer in zip(panels[0], optimizers):
                for m in METHODS:
                    runs = [r for r in study["runs"]
                            if (r["case"], r["optimizer"], r["method"]) == (case, optimizer, m.key)]
                    if not runs or (axis == "time" and (case, m.key) not in timing):
                        continue
                    xs, mean, spread = mean_curve(runs)
                    if axis == "time":
                        xs = [x / timing[case, m.key] for x in xs]
                    colour, style = STYLE[m.key]
                    panel.plot(xs, mean, color=colour, linestyle=style, label=m.label,
                               linewidth=0.9 if m.key == "avgpipe-1" else 1.4)
                    panel.fill_between(xs, [a - d for a, d in zip(mean, spread)],
                                       [a + d for a, d in zip(mean, spread)], color=colour, alpha=0.1)
                name, kwargs = settings["optimizers"][optimizer]
                panel.set_title({"sgd": "SGD momentum 0.9", "adam": "Adam", "adamw": "AdamW"}[name]
                                + f", lr {kwargs['lr']:g}")
                panel.set_xlabel({"samples": "training samples seen",
                                  "time": f"wall time (s): {DEPTH} processes on a "
                                          f"{study['settings']['cpus']}-core machine"}[axis])
                panel.set_ylabel("training loss (moving average; mean ± std over seeds)")
                panel.grid(alpha=0.3)
                panel.legend(fontsize=8, loc="upper right")
            figure.suptitle(f"{settings['title']}: AvgPipe vs 1F1B, loss vs {axis} — P={DEPTH}, "
                            f"M={MICROBATCHES}, B={settings['update_size']} per pipeline, "
                            f"{len(study['settings']['seeds'])} seed(s)")
            figure.tight_layout()
            path = plot_dir / f"avgpipe_convergence_{case}_{axis}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


# -- command line -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_BATCHES} batches, one seed, no multi-process timing")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS),
                        choices=["sgdm", "sgdm-3x", "adam", "adamw"])
    parser.add_argument("--methods", nargs="+", default=METHOD_KEYS, choices=METHOD_KEYS)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--batches", type=int, default=None,
                        help="override every case's K (batches of B; a multiple of 6)")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--no-timing", action="store_true", help="skip the multi-process runs")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="timing runs per method and case (the median is used)")
    parser.add_argument("--reuse-runs", type=Path, default=None,
                        help="take the training runs from this study JSON; only re-time")
    cv.add_output_arguments(parser, DEFAULT_JSON, DEFAULT_PLOTS)
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    batches = args.batches or (QUICK_BATCHES if args.quick else None)
    reuse = json.loads(args.reuse_runs.read_text())["runs"] if args.reuse_runs else None
    started = time.perf_counter()
    study = run_study([CASES[c] for c in args.cases], [method(k) for k in args.methods],
                      optimizers=args.optimizers, seeds=seeds, batches=batches,
                      timing=not (args.quick or args.no_timing), repeats=args.repeats,
                      workers=args.workers, reuse=reuse)
    study["settings"]["total_seconds"] = time.perf_counter() - started
    if args.reuse_runs is not None:  # provenance: which study trained the runs, and how long
        earlier = json.loads(args.reuse_runs.read_text())["settings"]
        study["settings"]["runs_reused_from"] = str(args.reuse_runs)
        study["settings"]["runs_total_seconds"] = earlier.get("total_seconds")
    study["summary"] = summary_rows(study)
    print(markdown(study["summary"]))
    print(f"\ntotal {study['settings']['total_seconds']:.0f} s")
    cv.write_study(study, args, DEFAULT_JSON, DEFAULT_PLOTS, plot)
    return study


if __name__ == "__main__":
    main()
