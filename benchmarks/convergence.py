"""Convergence study: every weight-update semantics, same samples, same seeds, 4 stages.

Run (about 15 minutes on a 2-core machine; ``--quick`` is a < 1 minute smoke version)::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/convergence.py \
        [--quick] [--cases gpt cnn] [--seeds 0 1 2] [--workers 2] [--no-timing] \
        [--json-out benchmarks/results/convergence.json] [--plot-dir docs/img]

Two models: the built-in GPT-tiny (10 blocks, byte-level, 64-token sequences) on the standard
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

What "the same number of updates" means. A per-micro-batch method (PipeDream, PipeOptim,
SpecTrain) steps the optimizer after every micro-batch; a per-batch method (GPipe, 1F1B, 2BW,
WPipe) after every M micro-batches. We fix the UPDATE SIZE ``U`` (samples averaged into one
optimizer step) and the update count ``K`` for every method -- the comparison the papers make
(pipeoptim.txt §V-B compares every method at the same mini-batch per update, GPipe with one
micro-batch as the synchronous baseline):

* per-batch methods: batch ``U`` split into M = 4 micro-batches of ``U/M``; K iterations;
* per-micro-batch methods ("equal-update" geometry): micro-batches of ``U``, batches of
  ``M*U``, ``K/M`` iterations.

Every method thus takes K updates of U samples and sees the same ``K*U`` samples in the same
order (per-micro-batch batch j is the concatenation of per-batch batches 4j..4j+3), so at a
given seed loss-vs-updates and loss-vs-samples line up and the curves differ only by the
weight semantics. Because the pipeline shape then differs (bigger micro-batches), the study
also runs the per-micro-batch methods in the "equal-microbatch" geometry: the SAME micro-batch
``U/M`` and batch ``U`` as the per-batch methods, which gives them M times as many updates of M
times fewer samples over the same samples -- how they would run on the same hardware. That
geometry is shown in the loss-vs-samples and loss-vs-wall-time plots (dashed).

Losses are the training loss of each U-sample group at the weights its forward used (what the
run reports), averaged over seeds; the table's "final loss" is the mean over the last 10 % of
the groups. At the end the final parameters (``Job(return_parameters=True)``) are loaded into a
fresh model and evaluated: held-out loss on the corpus' test split (GPT), test loss and
accuracy on the digits test split (CNN).

Executors. The loss curves come from the single-process executor ``run_local`` (one process
interprets every rank's program; it gives bit-identical numbers to the multi-process run, which
this script checks on every timing run), run ``--workers`` at a time. Wall time comes from ONE
multi-process run per method and geometry (``launch_local``, one process per rank, gloo on the
loopback): its steady-state samples/s (``pipeweave.runtime.summary.summarize``, first iteration
excluded) converts samples into seconds. These runs go one at a time, nothing else of ours
running. On 2 cores 4 ranks share 2 CPUs, so the wall-time axis shows the methods' relative
cost on this machine, not on 4 devices.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pipeweave.data import build_dataset
from pipeweave.models import build_model
from pipeweave.runtime import (
    BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult, launch_local, run_local,
)
from pipeweave.runtime.summary import iteration_losses, summarize
from pipeweave.testing import merged_parameters

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
QUIET_WAIT_S = 20.0

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
    """``"sgdm" | "adam" | "adamw"`` -> (torch.optim name, keyword arguments)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    wpipe_depth: int = DEPTH
    """Ranks for WPipe (it needs 2 x depth stages; the CNN has only 5 blocks)."""
    eval_batches: int = 1
    eval_batch_size: int = 359


CASES = {
    # Learning rates: the better of a short sweep for the non-pipelined model (SGDM 0.1/0.3/1.0,
    # Adam 1e-3/3e-3/1e-2 for GPT; SGDM 0.03-0.3, Adam 1e-3-1e-2 for the CNN), kept off the
    # edge of stability.
    "gpt": Case("gpt", "GPT-tiny on the stdlib corpus", "gpt-tiny", "stdlib-bytes", 64,
                update_size=16, updates=120,
                optimizers={"sgdm": ("sgd", {"lr": 0.1, "momentum": 0.9}),
                            "adam": ("adam", {"lr": 1e-3}),
                            "adamw": ("adamw", {"lr": 1e-3, "weight_decay": 0.1})},
                eval_batches=4, eval_batch_size=64),
    # 5 blocks: P = 4 stages [conv0+conv1 | conv2 | fc | head]; WPipe runs 2 ranks x 2 chunks =
    # 4 stages [conv0+conv1 | conv2 ‖ fc | head] (G0 = convs, G1 = fc, head).
    "cnn": Case("cnn", "CNN on 8x8 digits", "cnn", "digits", None,
                update_size=32, updates=168,
                optimizers={"sgdm": ("sgd", {"lr": 0.05, "momentum": 0.9}),
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


METHODS = (
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
    Method("pipeoptim-adam", "PipeOptim (Adam)", "pipeoptim", "adam", True, "1f1b-adam"),
    Method("1f1b-adamw", "1F1B (AdamW)", "1f1b", "adamw", False, "1f1b-adamw"),
    Method("pipeoptim-adamw", "PipeOptim (AdamW)", "pipeoptim", "adamw", True, "1f1b-adamw"),
)
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
    # Each micro-batch's loss was scaled by rows/batch_rows = 1/M (runtime/stage.py).
    return [weighted[j] * job.plan.microbatches for j in sorted(weighted)]


def evaluate(case: Case, parameters: dict[str, Tensor], seed: int) -> dict[str, float]:
    """Held-out loss (and accuracy for classifiers) of the final parameters."""
    spec = build_model(case.model, seed=seed, **case.overrides)
    model = spec.sequential()
    model.load_state_dict(parameters, strict=True)
    model.eval()
    # The same held-out samples for every method and seed (fixed stream seed).
    stream = build_dataset(case.dataset, batch_size=case.eval_batch_size, seq_len=case.seq_len,
                           seed=12345, split="test")
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in islice(stream, case.eval_batches):
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
    results = run_local(job)
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
def busy_share(seconds: float = 0.5) -> float:
    """Share of all CPUs busy over ``seconds`` (Linux /proc/stat; 0.0 elsewhere)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return 0.0
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def time_one(case: Case, method: Method, geometry: str, updates: int) -> dict[str, Any]:
    """Steady-state samples/s of one multi-process run (seed 0), plus its first losses."""
    num_blocks = len(build_model(case.model, **case.overrides).blocks)
    job = make_job(case, method, geometry, 0, updates=updates, num_blocks=num_blocks)
    steps = TIMED_BATCHES + 1
    # Batches made here and shipped to the ranks: no rank re-reads the corpus or scikit-learn.
    batches = tuple(islice(iter(job.data()), steps))
    job = replace(job, steps=steps, data=functools.partial(iter, batches), record_timeline=True,
                  return_parameters=False)
    deadline = time.monotonic() + QUIET_WAIT_S
    busy = busy_share()
    while busy > QUIET_BUSY and time.monotonic() < deadline:
        busy = busy_share()
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
            if g == "equal-update" or m.per_microbatch]


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
                 == (record["case"], record["method"], record["geometry"], 0)]
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


def _report(run: dict[str, Any], done: int, total: int) -> None:
    extra = f" acc {run['test_accuracy']:.3f}" if "test_accuracy" in run else ""
    print(f"  [{done:3}/{total}] {run['case']:4} {run['method']:16} {run['geometry']:17} "
          f"seed {run['seed']}: final {final_loss(run['loss_per_group']):.3f} "
          f"held-out {run['heldout_loss']:.3f}{extra} ({run['local_seconds']:.1f} s)", flush=True)


def final_loss(groups: Sequence[float]) -> float:
    tail = max(1, round(len(groups) * FINAL_FRACTION))
    return statistics.fmean(groups[-tail:])


# -- tables and plots -------------------------------------------------------------------------
def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summary_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (case, method, geometry): means and standard deviations over seeds."""
    rows = []
    timing = {(t["case"], t["method"], t["geometry"]): t for t in study["timing"]}
    keys = sorted({(r["case"], r["method"], r["geometry"]) for r in study["runs"]},
                  key=lambda k: (k[0], GEOMETRIES.index(k[2]), [m.key for m in METHODS].index(k[1])))
    for case, method, geometry in keys:
        runs = [r for r in study["runs"] if (r["case"], r["method"], r["geometry"]) == (case, method, geometry)]
        row: dict[str, Any] = {"case": case, "method": method, "geometry": geometry,
                               "updates": runs[0]["updates"], "seeds": len(runs)}
        row["final_loss"] = _mean_std([final_loss(r["loss_per_group"]) for r in runs])
        row["heldout_loss"] = _mean_std([r["heldout_loss"] for r in runs])
        if "test_accuracy" in runs[0]:
            row["test_accuracy"] = _mean_std([r["test_accuracy"] for r in runs])
        if (case, method, geometry) in timing:
            row["samples_per_second"] = timing[case, method, geometry]["samples_per_second"]
        rows.append(row)
    for row in rows:  # paired difference to the synchronous baseline (same seeds, same samples)
        baseline = _method(row["method"]).baseline
        pairs = [(final_loss(r["loss_per_group"]), final_loss(b["loss_per_group"]))
                 for r in study["runs"] if (r["case"], r["method"], r["geometry"]) == (row["case"], row["method"], row["geometry"])
                 for b in study["runs"] if (b["case"], b["method"], b["seed"]) == (row["case"], baseline, r["seed"])
                 and b["geometry"] == "equal-update"]
        if pairs:
            row["delta_vs_sync"] = _mean_std([a - b for a, b in pairs])
    return rows


def _method(key: str) -> Method:
    return next(m for m in METHODS if m.key == key)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    def pm(value: tuple[float, float], digits: int = 3) -> str:
        return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"

    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        accuracy = any("test_accuracy" in r for r in rows if r["case"] == case)
        lines += [f"\n**{CASES[case].title if case in CASES else case}**\n",
                  "| method | geometry | updates | final train loss | Δ vs sync (paired) | "
                  + ("test loss | test accuracy" if accuracy else "held-out loss")
                  + " | samples/s (4 proc.) |",
                  "|---|---|---:|---:|---:|---:|" + ("---:|" if accuracy else "") + "---:|"]
        for r in (r for r in rows if r["case"] == case):
            cells = [_method(r["method"]).label, r["geometry"], str(r["updates"]), pm(r["final_loss"]),
                     pm(r["delta_vs_sync"]) if "delta_vs_sync" in r else "", pm(r["heldout_loss"])]
            if accuracy:
                cells.append(pm(r["test_accuracy"]))
            cells.append(f"{r['samples_per_second']:.0f}" if "samples_per_second" in r else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


STYLE = {  # colour per method; synchronous in black/grey
    "gpipe": ("#888888", ":"), "1f1b": ("#000000", "-"), "pipedream": ("#1f77b4", "-"),
    "pipedream-vs": ("#17becf", "-"), "2bw": ("#ff7f0e", "-"), "wpipe": ("#2ca02c", "-"),
    "pipeoptim-sgdm": ("#d62728", "-"), "spectrain": ("#9467bd", "-"),
    "1f1b-adam": ("#000000", "-"), "pipeoptim-adam": ("#d62728", "-"),
    "1f1b-adamw": ("#555555", "-"), "pipeoptim-adamw": ("#e377c2", "-"),
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
    """Per case: loss vs updates, vs samples and vs wall time; SGDM and Adam(W) panels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing = {(t["case"], t["method"], t["geometry"]): t["samples_per_second"] for t in study["timing"]}
    written = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for case in dict.fromkeys(r["case"] for r in study["runs"]):
        settings = next(c for c in study["settings"]["cases"] if c["key"] == case)
        update_size = settings["update_size"]
        for axis in ("updates", "samples", "time"):
            if axis == "time" and not timing:
                continue
            figure, panels = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
            for panel, family in zip(panels, (("sgdm",), ("adam", "adamw"))):
                for method, geometry in variants(METHODS, GEOMETRIES):
                    runs = [r for r in study["runs"] if (r["case"], r["method"], r["geometry"])
                            == (case, method.key, geometry)]
                    if not runs or method.optimizer not in family:
                        continue
                    if axis == "updates" and geometry != "equal-update":
                        continue  # M x more updates of M x fewer samples: see the samples plot
                    if axis == "time" and (case, method.key, geometry) not in timing:
                        continue
                    curves = [smooth(r["loss_per_group"], max(1, len(r["loss_per_group"]) // 12))
                              for r in runs]
                    mean = [statistics.fmean(c) for c in zip(*curves)]
                    spread = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in zip(*curves)]
                    groups = range(1, len(mean) + 1)
                    xs: list[float] = [float(g) for g in groups]  # updates = U-sample groups
                    if axis in ("samples", "time"):
                        xs = [g * update_size for g in groups]
                    if axis == "time":
                        xs = [x / timing[case, method.key, geometry] for x in xs]
                    colour, style = STYLE[method.key]
                    label = method.label + (" [equal micro-batch]" if geometry != "equal-update" else "")
                    panel.plot(xs, mean, color=colour, linestyle="--" if geometry != "equal-update" else style,
                               linewidth=1.4, label=label)
                    panel.fill_between(xs, [m - s for m, s in zip(mean, spread)],
                                       [m + s for m, s in zip(mean, spread)], color=colour, alpha=0.12)
                panel.set_title({"sgdm": "SGD with momentum", "adam": "Adam / AdamW"}[family[0]])
                panel.set_xlabel({"updates": f"optimizer updates (each {update_size} samples)",
                                  "samples": "training samples seen",
                                  "time": "wall time (s), 4 processes on this machine"}[axis])
                panel.grid(alpha=0.3)
                panel.legend(fontsize=7.5, loc="upper right")
            panels[0].set_ylabel("training loss (moving average, mean ± std over seeds)")
            figure.suptitle(f"{settings['title']}: loss vs {axis}, P={DEPTH}, M={MICROBATCHES}, "
                            f"{len(study['settings']['seeds'])} seeds")
            figure.tight_layout()
            path = plot_dir / f"convergence_{case}_{axis}.png"
            figure.savefig(path, dpi=110)
            plt.close(figure)
            written.append(path)
    return written


# -- command line -----------------------------------------------------------------------------
QUICK_UPDATES = 8


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_UPDATES} updates, one seed, no multi-process timing")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--methods", nargs="+", default=[m.key for m in METHODS],
                        choices=[m.key for m in METHODS])
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--updates", type=int, default=None, help="override every case's K")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--no-timing", action="store_true", help="skip the multi-process runs")
    parser.add_argument("--json-out", type=Path, default=None,
                        help=f"default {DEFAULT_JSON.relative_to(ROOT)} (none with --quick)")
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help=f"default {DEFAULT_PLOTS.relative_to(ROOT)} (none with --quick)")
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    updates = args.updates or (QUICK_UPDATES if args.quick else None)
    methods = [m for m in METHODS if m.key in args.methods]
    started = time.perf_counter()
    study = run_study([CASES[c] for c in args.cases], methods, seeds=seeds, updates=updates,
                      timing=not (args.quick or args.no_timing), workers=args.workers)
    study["settings"]["total_seconds"] = time.perf_counter() - started
    rows = summary_rows(study)
    study["summary"] = rows
    print(markdown(rows))
    print(f"\ntotal {study['settings']['total_seconds']:.0f} s")
    json_out = args.json_out or (None if args.quick else DEFAULT_JSON)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(study, indent=1) + "\n")
        print(f"wrote {json_out}")
    plot_dir = args.plot_dir or (None if args.quick else DEFAULT_PLOTS)
    if plot_dir is not None:
        for path in plot(study, plot_dir):
            print(f"wrote {path}")
    return study


if __name__ == "__main__":
    main()
