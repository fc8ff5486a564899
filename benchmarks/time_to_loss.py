"""Time to loss: which weight semantics reaches a held-out loss first, on the clock.

Run (``--quick``: under a minute of CPU, see docs/convergence.md; the full study runs in
parts, ``--resume`` appends, ``--merge`` puts together parts run side by side)::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/time_to_loss.py --quick
    PYTHONPATH=src .venv/bin/python benchmarks/time_to_loss.py --models gpt-tiny --resume
    PYTHONPATH=src .venv/bin/python benchmarks/time_to_loss.py --models gpt-tiny --ranks 4 \
        --methods 1F1B PipeDream PipeDream+warmup --seeds 1 2 --resume
    PYTHONPATH=src .venv/bin/python benchmarks/time_to_loss.py --models cnn --resume
    PYTHONPATH=src .venv/bin/python benchmarks/time_to_loss.py --models gpt-small --updates 200 --resume

For each model (GPT-tiny and GPT-small with Adam, the CNN with SGD-momentum: :data:`OPTIMIZERS`;
the models, data, optimizers and held-out sets of ``benchmarks/convergence.py``, whose
:func:`convergence.evaluate` computes every held-out loss here, its model built once per
model and seed, :class:`Evaluator`) and P = 2 and 4 ranks, every method of :data:`METHODS` trains from the same initial
weights on the same sample stream: batches of U samples in M micro-batches, the same for every
method (what ``--schedule X`` changes on one configuration: memory and micro-batch stay put).
A per-batch method (1F1B, 2BW, WPipe) updates once per batch; a per-micro-batch one
(PipeDream, PipeOptim) once per micro-batch, the optimizer's full step on U/M samples.

* **Loss curves** come from the single-process executor (``run_local``, the same numbers as
  the multi-process runtime: every timing run below checks its first losses against it,
  ``bit_identical_to_local``). Every ``eval_every`` batches' worth of samples the weights each
  stage has after the update that consumed those samples are copied (:class:`Snapshots`, a
  rank feature) and the assembled model's held-out loss is computed. For an asynchronous
  method that model never exists at one instant; it is the model the run returns if stopped
  there after draining. 1F1B's and 2BW's curves do not depend on P (:data:`RANK_FREE`): one
  run serves both.
* **Samples/s** per (model, P, method) come from a short multi-process run (``launch_local``,
  one process per rank, gloo, 24 timed iterations): six batches over the quickest quarter of
  the times of six consecutive iterations (:func:`measure_once` says why), the best of
  ``--timing-repeats`` runs taken round-robin over the methods (:func:`time_methods`); ``--timing-from FILE`` puts
  another result file's timings in place of this one's (a re-timing pass run apart).
  The issue-12 throughput results (``benchmarks/results/async_throughput*.json``) are for a
  different model (d 128, L 4, T 64) and batch, so they are not reused. A correction row
  shares its uncorrected method's samples/s (``MethodRow.timed_as``); a warm-up row is timed
  itself too (its timed iterations all inside the warm-up: a fill and drain per update), which
  times its first K batches (:func:`seconds_for`).
* **Time to a target** = samples the (seed-mean) held-out curve needs to first reach it,
  linearly interpolated between evaluations, divided by the method's samples/s. With several
  seeds the table adds the spread: each seed's time to its own 1F1B run's final loss. Targets: a
  ladder at 50/75/90/100 % of 1F1B's drop from the initial loss to its final one; the last rung
  is "1F1B's final loss", reported as a ratio to 1F1B's own time.

The methods are one data table of (label, schedule, options) rows, so a variant (a stale-weight
correction) is one added row. The result file (``benchmarks/results/time_to_loss.json``) is
written after every run; ``--resume`` keeps its runs and timings and adds only what is
missing, so the study runs in parts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convergence as cv  # noqa: E402
from machine_load import wait_for_quiet  # noqa: E402

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from pipeweave.ir import Action, Op  # noqa: E402
from pipeweave.models import build_model  # noqa: E402
from pipeweave.models.naming import global_names  # noqa: E402
from pipeweave.runtime import (  # noqa: E402
    BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, iteration_losses, launch_local,
    run_local,
)
from pipeweave.runtime.execution.features import RankFeature  # noqa: E402
from pipeweave.runtime.execution.interpreter import RankInterpreter  # noqa: E402
from pipeweave.runtime.execution.parts import make_schedule  # noqa: E402
from pipeweave.runtime.observation.summary import summarize  # noqa: E402

__all__ = ["METHODS", "MODELS", "MethodRow", "first_reach", "mean_curve", "ladder",
           "time_to_loss_rows", "main"]

# -- settings -------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "time_to_loss.json"
QUICK_JSON = ROOT / "benchmarks" / "results" / "time_to_loss_quick.json"
DEFAULT_PLOTS = ROOT / "docs" / "img"
RANKS = (2, 4)
BASELINE = "1F1B"
LADDER = (0.5, 0.75, 0.9, 1.0)
"""Targets: these fractions of 1F1B's drop from the initial held-out loss to its final one."""
TIMED_STEPS = 24          # timed iterations of a multi-process run (plus one warm-up)
QUICK_TIMED = 8           # with --quick (where no earlier result file has the timing)
RATE_QUANTILE = 0.25      # samples/s from this quantile of the windows' times (see measure_once)
RATE_WINDOW = 6           # iterations per window
QUIET_WAIT_S = 5.0        # wait up to this long for the machine to be quiet before each
OPTIMIZERS = {"gpt-tiny": "adam", "gpt-small": "adam", "cnn": "sgdm"}
"""Each model's optimizer (a key of its ``convergence.CASES`` optimizers): the issue's GPT-tiny
setting (Adam lr 1e-3), and the CNN's SGD with momentum 0.9 at lr 0.015 of the equal-update study."""


class MethodRow(NamedTuple):
    """One method of the study: a label, a registered schedule and its schedule options."""

    label: str
    schedule: str
    options: dict[str, Any]
    optimizer: str | None = None
    """``"nadam"``: torch's NAdam with the model's Adam settings (refused on other models);
    None: the model's optimizer (:data:`OPTIMIZERS`)."""
    timed_as: str | None = None
    """The row whose samples/s this one shares (the same actions after its warm-up: a
    correction changes numbers, not work); None: measured itself."""


METHODS: tuple[MethodRow, ...] = (
    MethodRow("1F1B", "1f1b", {}),
    MethodRow("PipeDream", "pipedream", {}),
    MethodRow("2BW", "2bw", {}),
    MethodRow("WPipe", "wpipe", {}),
    MethodRow("PipeOptim", "pipeoptim", {}),
    MethodRow("PipeDream+warmup", "pipedream", {"warmup": 50}, timed_as="PipeDream"),
    MethodRow("PipeDream+PipeMare", "pipedream", {"pipemare": 300}, timed_as="PipeDream"),
    MethodRow("PipeDream+Nesterov", "pipedream", {"nesterov": 0.99}, timed_as="PipeDream"),
    MethodRow("PipeDream (NAdam)", "pipedream", {}, "nadam", timed_as="PipeDream"),
    MethodRow("PipeDream+Nesterov (NAdam)", "pipedream", {"nesterov": 0.99}, "nadam",
              timed_as="PipeDream"),
)
"""The study's methods; a correction (a schedule option, docs/semantics.md "Stale-weight
corrections") is one more row, timed as its uncorrected method. The delay-aware Nesterov
correction (``nesterov=G``) is defined for SGD with momentum (the CNN) and NAdam: on the Adam
models it runs with NAdam, against PipeDream with NAdam; a row whose optimizer does not fit
the model is skipped (said in the result file)."""
BASE_METHODS = tuple(m.label for m in METHODS if not m.options and m.optimizer is None)
"""``--quick``'s default: the uncorrected methods (a 24-batch run is all warm-up)."""

MODELS: dict[str, cv.Case] = {
    # updates: batches of U samples in the full study (the issue: >= 1,000 on GPT-tiny).
    "gpt-tiny": replace(cv.CASES["gpt"], key="gpt-tiny", updates=1000),
    "gpt-small": replace(cv.CASES["gpt"], key="gpt-small", title="GPT-small on the stdlib corpus",
                         model="gpt-small", seq_len=128, updates=300, eval_batches=2,
                         eval_batch_size=32),
    "cnn": replace(cv.CASES["cnn"], updates=600),
}
EVAL_POINTS = 40          # held-out evaluations per run (plus the initial weights)
QUICK = {"gpt-tiny": (24, 3), "gpt-small": (4, 2), "cnn": (24, 3)}
"""Batches per run and held-out evaluations with ``--quick`` (an evaluation is a forward of the
held-out set: on GPT-small 64 windows of 128 tokens, about as long as a training batch)."""


# -- training: one run, its held-out curve --------------------------------------------------
class Snapshots(RankFeature):
    """Copies a stage's parameters (by global name) right after its updates to ``versions``:
    put together over the stages, the model after that many updates of every stage."""

    def __init__(self, versions: Iterable[int], taken: dict[int, dict[str, Tensor]]) -> None:
        self.versions, self.taken = frozenset(versions), taken

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is not Op.STEP or action.version not in self.versions:
            return
        stage = interpreter.stages[action.stage]
        named = global_names(stage.module.named_parameters(), stage.block_range[0])
        self.taken.setdefault(action.version, {}).update(
            {name: param.detach().cpu().clone() for name, param in named})


def make_plan(case: cv.Case, method: MethodRow, ranks: int) -> Plan:
    """``method`` on ``ranks`` ranks, uniform stages (WPipe: two chunks per rank)."""
    blocks = len(build_model(case.model, **case.overrides).blocks)
    chunks = 2 if method.schedule == "wpipe" else 1
    return Plan.uniform(blocks, ranks, chunks=chunks, schedule=method.schedule,
                        microbatches=cv.MICROBATCHES, schedule_options=method.options)


def optimizer_of(case: cv.Case, method: MethodRow) -> tuple[str, dict[str, float]]:
    """The torch optimizer name and settings ``method`` trains ``case`` with."""
    name, kwargs = case.optimizers[OPTIMIZERS.get(case.key, "adam")]
    if method.optimizer is None:
        return name, kwargs
    if method.optimizer != "nadam" or name != "adam":
        raise ValueError(f"{method.label}: optimizer {method.optimizer!r} replaces Adam only; "
                         f"{case.key} trains with {name}: leave the row out for {case.key}")
    return "nadam", kwargs


def make_job(case: cv.Case, plan: Plan, seed: int, steps: int,
             optimizer: tuple[str, dict[str, float]] | None = None) -> Job:
    name, kwargs = optimizer or case.optimizers[OPTIMIZERS.get(case.key, "adam")]
    return Job(plan=plan, steps=steps, model=BuiltinModel(case.model, seed=seed, overrides=case.overrides),
               data=BuiltinData(case.dataset, batch_size=case.update_size, seq_len=case.seq_len,
                                seed=seed),
               optimizer=OptimizerFactory(name, kwargs), seed=seed, record_timeline=False)


def updates_per_batch(plan: Plan) -> int:
    """Optimizer steps of the first stage per batch (1 per-batch, M per-micro-batch)."""
    schedule = make_schedule(plan, 1)
    return sum(1 for program in schedule.programs for a in program
               if a.op is Op.STEP and a.stage == 0)


class Evaluator:
    """``convergence.evaluate`` with the evaluation model and held-out batches built once per
    (model, seed), and the initial weights' metrics computed once: the same numbers, without
    rebuilding a model per evaluation (what made ``--quick`` slow)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], cv.HeldOut] = {}
        self.initial: dict[tuple[str, int], dict[str, float]] = {}

    def __call__(self, case: cv.Case, parameters: dict[str, Tensor] | None,
                 seed: int) -> dict[str, float]:
        """Metrics of ``parameters`` (None: the initial weights of ``seed``)."""
        key = (case.key, seed)
        if key not in self.held:
            self.held[key] = cv.held_out(case, seed)
        if parameters is not None:
            return cv.evaluate(case, parameters, seed, self.held[key])
        if key not in self.initial:
            initial = build_model(case.model, seed=seed, **case.overrides).materialized("cpu")
            self.initial[key] = cv.evaluate(case, dict(initial.sequential().state_dict()),
                                            seed, self.held[key])
        return self.initial[key]


EVALUATE = Evaluator()


def eval_points(batches: int, every: int) -> list[int]:
    """Batches after which to evaluate: every ``every``, and the last."""
    points = list(range(every, batches + 1, every)) or [batches]
    return points if points[-1] == batches else [*points, batches]


def train(case: cv.Case, method: MethodRow, ranks: int, seed: int, batches: int,
          eval_every: int) -> dict[str, Any]:
    """One single-process run; its held-out loss every ``eval_every`` batches' samples."""
    record: dict[str, Any] = {"model": case.key, "ranks": ranks, "method": method.label,
                              "schedule": method.schedule, "options": method.options,
                              "seed": seed, "batches": batches}
    try:
        plan = make_plan(case, method, ranks)
        optimizer = optimizer_of(case, method)
    except ValueError as error:
        return {**record, "skipped": str(error)}
    per_batch = updates_per_batch(plan)
    points = eval_points(batches, eval_every)
    taken: dict[int, dict[str, Tensor]] = {}
    job = make_job(case, plan, seed, batches, optimizer)
    started = time.perf_counter()
    try:
        results = run_local(job, features=lambda rank, program: [
            Snapshots((b * per_batch for b in points), taken)])
    except FloatingPointError as error:
        return {**record, "diverged": str(error)}
    seconds = time.perf_counter() - started
    curve = [EVALUATE(case, None, seed)]
    curve += [EVALUATE(case, taken[b * per_batch], seed) for b in points]
    return {**record, "optimizer": [optimizer[0], optimizer[1]], "updates_per_batch": per_batch,
            "samples": [0] + [b * case.update_size for b in points],
            "heldout_loss": [c["heldout_loss"] for c in curve],
            **({"test_accuracy": [c["test_accuracy"] for c in curve]}
               if "test_accuracy" in curve[0] else {}),
            "train_loss": iteration_losses(results, cv.MICROBATCHES),
            "local_seconds": seconds}


# -- wall time: short multi-process runs ----------------------------------------------------
def measure_once(case: cv.Case, method: MethodRow, ranks: int,
                 timed: int = TIMED_STEPS) -> dict[str, Any]:
    """Samples/s of one multi-process run (seed 0) and its batch losses.

    The rate is ``RATE_WINDOW`` batches over the ``RATE_QUANTILE`` quantile of the times of every
    window of that many consecutive iterations (the first iteration left out), not the mean
    rate: on a machine that other jobs saturate (this one: 2 cores, a load of 10-20) most
    iterations are stretched by them, and the quickest quarter of the windows is the closest to
    what the schedule does alone. Windows, not single iterations, because an asynchronous
    schedule ends its iterations in bursts. The mean rate is recorded beside it
    (``mean_samples_per_second``)."""
    plan = make_plan(case, method, ranks)
    steps = timed + 1
    if 0 < method.options.get("warmup", 0) < steps:
        raise ValueError(f"{method.label}: warmup={method.options['warmup']} ends inside the "
                         f"{steps} timed iterations; time it with fewer (--quick) or a longer warm-up")
    job = make_job(case, plan, 0, steps)
    batches = tuple(islice(iter(job.data()), steps))  # made once, shipped to the ranks
    job = replace(job, data=_Replay(batches), record_timeline=True)
    busy = wait_for_quiet(QUIET_WAIT_S, 0.3, sample_s=0.5)
    results = launch_local(job, deadline_s=600)
    summary = summarize(results, schedule=method.schedule, steps=steps,
                        batch_size=case.update_size, microbatches=cv.MICROBATCHES)
    ends = summary.iteration_end_s
    window = min(RATE_WINDOW, len(ends) - 2)
    spans = sorted(b - a for a, b in zip(ends[1:], ends[1 + window:]))
    quick = spans[min(len(spans) - 1, int(RATE_QUANTILE * len(spans)))]
    return {"samples_per_second": window * case.update_size / quick,
            "mean_samples_per_second": summary.samples_per_second, "busy_before": busy,
            "train_loss": iteration_losses(results, cv.MICROBATCHES)}


def time_methods(case: cv.Case, methods: Sequence[MethodRow], ranks: int,
                 repeats: int, timed: int = TIMED_STEPS) -> list[dict[str, Any]]:
    """One timing record per method: the best samples/s of ``repeats`` runs, taken round-robin
    over the methods (a burst of other work on the machine then hits them alike). The best, not
    the median: other jobs only ever slow a run down (here by up to 10x between repeats), so
    the least disturbed run is the closest to the schedule alone."""
    records: dict[str, dict[str, Any]] = {}
    for method in methods:
        records[method.label] = {"model": case.key, "ranks": ranks, "method": method.label,
                                 "batch_size": case.update_size, "repeats": []}
        try:
            make_plan(case, method, ranks)
        except ValueError as error:
            records[method.label]["skipped"] = str(error)
    for _ in range(repeats):
        for method in methods:
            record = records[method.label]
            if "skipped" not in record:
                record["repeats"].append(measure_once(case, method, ranks, timed))
    for record in records.values():
        if record["repeats"]:
            record["samples_per_second"] = max(r["samples_per_second"] for r in record["repeats"])
            record["train_loss"] = record["repeats"][-1].pop("train_loss")
            record["source"] = (f"measured: launch_local, {ranks} processes, best of "
                                f"{len(record['repeats'])} runs, each the {RATE_QUANTILE:g} "
                                f"quantile of the times of {RATE_WINDOW} consecutive iterations of {timed}")
    return list(records.values())


class _Replay:
    """A picklable data factory replaying fixed batches."""

    def __init__(self, batches: tuple[tuple[Tensor, Tensor], ...]) -> None:
        self.batches = batches

    def __call__(self) -> Iterable[tuple[Tensor, Tensor]]:
        return iter(self.batches)


# -- pure parts: curves, targets, rows ------------------------------------------------------
def first_reach(xs: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The first ``x`` at which the piecewise-linear curve reaches ``target`` (None: never).

    Between the last point above the target and the first at or below it, the crossing is
    interpolated linearly; a curve that starts at or below the target reaches it at ``xs[0]``.
    """
    if len(xs) != len(losses):
        raise ValueError(f"xs has {len(xs)} points and losses {len(losses)}; pass one loss per x")
    for i, loss in enumerate(losses):
        if math.isfinite(loss) and loss <= target:
            if i == 0:
                return float(xs[0])
            before = losses[i - 1]
            share = (before - target) / (before - loss) if math.isfinite(before) else 1.0
            return float(xs[i - 1] + share * (xs[i] - xs[i - 1]))
    return None


def mean_curve(runs: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """Samples and the seed-mean held-out loss over the points every run has."""
    length = min(len(r["samples"]) for r in runs)
    samples = [float(s) for s in runs[0]["samples"][:length]]
    return samples, [statistics.fmean(r["heldout_loss"][i] for r in runs) for i in range(length)]


def ladder(initial: float, final: float, fractions: Sequence[float] = LADDER) -> list[float]:
    """Targets at ``fractions`` of the way from ``initial`` down to ``final``."""
    return [initial - f * (initial - final) for f in fractions]


def _group(study: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, list[dict[str, Any]]]]:
    """(model, ranks) -> method -> its finished runs."""
    grouped: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for run in study["runs"]:
        if "skipped" in run or "diverged" in run:
            continue
        grouped.setdefault((run["model"], run["ranks"]), {}).setdefault(run["method"], []).append(run)
    return grouped


def _rates(study: Mapping[str, Any]) -> tuple[dict[tuple[str, int, str], float],
                                             dict[tuple[str, int, str], float]]:
    """(model, ranks, method) -> samples/s after any warm-up, and -> samples/s during a
    warm-up. A row timed as another (``MethodRow.timed_as``) gets that one's; a warm-up row's
    own timing (its timed iterations all inside the warm-up) is its warm-up rate."""
    warmups = {m.label for m in METHODS if m.options.get("warmup")}
    steady: dict[tuple[str, int, str], float] = {}
    warm: dict[tuple[str, int, str], float] = {}
    for t in study["timing"]:
        if "samples_per_second" in t:
            key = (t["model"], t["ranks"], t["method"])
            (warm if t["method"] in warmups else steady)[key] = t["samples_per_second"]
    for method in METHODS:
        for model, ranks, label in list(steady):
            if method.timed_as == label and (model, ranks, method.label) not in steady:
                steady[model, ranks, method.label] = steady[model, ranks, label]
    return steady, warm


def seconds_for(samples: float | None, rate: float | None, warm_rate: float | None,
                sync_samples: float = 0.0) -> float | None:
    """Wall time to train ``samples`` at ``rate`` samples/s, the first ``sync_samples`` (a
    synchronous warm-up: a fill and drain per update) at ``warm_rate``."""
    if samples is None or rate is None:
        return None
    warm = min(samples, sync_samples)
    if not warm:
        return samples / rate
    return None if warm_rate is None else warm / warm_rate + (samples - warm) / rate


def _warm_samples(run: Mapping[str, Any]) -> float:
    """Samples a run trains in its synchronous warm-up (``warmup=K`` batches)."""
    batch = run["samples"][-1] / run["batches"] if run.get("batches") else 0.0
    return float(run.get("options", {}).get("warmup", 0)) * batch


def _seed_ratios(runs: Sequence[Mapping[str, Any]], base_runs: Sequence[Mapping[str, Any]],
                 rate: float | None, base_rate: float | None,
                 warm_rate: float | None) -> list[float | None]:
    """Per seed that 1F1B also ran: time to that seed's 1F1B final loss, ×1F1B's time."""
    base_of = {r["seed"]: r for r in base_runs}
    ratios: list[float | None] = []
    for run in runs:
        base = base_of.get(run["seed"])
        if base is None:
            continue
        target = base["heldout_loss"][-1]
        mine = first_reach(run["samples"], run["heldout_loss"], target)
        theirs = seconds_for(first_reach(base["samples"], base["heldout_loss"], target),
                             base_rate, base_rate)
        spent = seconds_for(mine, rate, warm_rate, _warm_samples(run))
        ratios.append(None if spent is None or not theirs else spent / theirs)
    return ratios


def time_to_loss_rows(study: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, ranks, method): samples and seconds to every rung of the ladder of
    1F1B's (seed-mean) held-out curve, the time to 1F1B's final loss as a ratio to 1F1B's, and
    its spread over the seeds (each seed against 1F1B's run of the same seed)."""
    rates, warm_rates = _rates(study)
    rows = []
    for (model, ranks), methods in _group(study).items():
        if BASELINE not in methods:
            continue
        base_x, base_y = mean_curve(methods[BASELINE])
        targets = ladder(base_y[0], base_y[-1])
        base_rate = rates.get((model, ranks, BASELINE))
        base_s = seconds_for(first_reach(base_x, base_y, targets[-1]), base_rate, base_rate)
        base_samples = first_reach(base_x, base_y, targets[-1])
        for label, runs in methods.items():
            xs, ys = mean_curve(runs)
            rate = rates.get((model, ranks, label))
            warm, warm_rate = _warm_samples(runs[0]), warm_rates.get((model, ranks, label))
            reach = [first_reach(xs, ys, t) for t in targets]
            seconds = [seconds_for(n, rate, warm_rate, warm) for n in reach]
            rows.append({
                "model": model, "ranks": ranks, "method": label, "seeds": len(runs),
                "samples_per_second": rate, "final_heldout": ys[-1],
                "final_heldout_per_seed": [r["heldout_loss"][-1] for r in runs],
                "samples_seen": xs[-1], "targets": targets, "samples_to": reach,
                "seconds_to": seconds,
                "samples_ratio_to_1f1b": None if reach[-1] is None or not base_samples
                else reach[-1] / base_samples,
                "rate_ratio_to_1f1b": None if rate is None or base_rate is None
                else rate / base_rate,
                "ratio_to_1f1b": None if seconds[-1] is None or not base_s
                else seconds[-1] / base_s,
                "ratio_per_seed": _seed_ratios(runs, methods[BASELINE], rate, base_rate,
                                               warm_rate),
                **({"warmup_samples_per_second": warm_rate} if warm else {})})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per (model, ranks): the time-to-loss table, methods as rows, ladder rungs as columns."""
    lines: list[str] = []
    for model, ranks in dict.fromkeys((r["model"], r["ranks"]) for r in rows):
        group = [r for r in rows if (r["model"], r["ranks"]) == (model, ranks)]
        targets = group[0]["targets"]
        lines += [f"\n**{model}, P = {ranks}** (held-out loss; targets on 1F1B's curve; "
                  f"{group[0]['samples_seen']:.0f} samples each)\n",
                  "| method | samples/s | final held-out | " + " | ".join(
                      f"to {t:.3f}" for t in targets) + " | samples to 1F1B's final, ×1F1B | "
                  "samples/s ×1F1B | time to 1F1B's final, ×1F1B |",
                  "|---|---:|---:|" + "---:|" * len(targets) + "---:|---:|---:|"]
        for r in group:
            cells = [_reach(s, n) for s, n in zip(r["seconds_to"], r["samples_to"])]
            ratio = "never reached" if r["samples_to"][-1] is None else (
                "—" if r["ratio_to_1f1b"] is None else f"{r['ratio_to_1f1b']:.2f}")
            rate = "—" if r["samples_per_second"] is None else f"{r['samples_per_second']:.0f}"
            lines.append(f"| {r['method']} | {rate} | {r['final_heldout']:.3f}"
                         f"{_spread(r.get('final_heldout_per_seed', []), '.3f')} | "
                         + " | ".join(cells) + f" | {_times(r['samples_ratio_to_1f1b'])} | "
                         f"{_times(r['rate_ratio_to_1f1b'])} | {ratio}"
                         f"{_spread(r.get('ratio_per_seed', []), '.2f')} |")
    return "\n".join(lines)


def _spread(values: Sequence[float | None], spec: str) -> str:
    """`` (lo–hi, n seeds)`` over several seeds (a seed that never reached counts as never);
    nothing for one."""
    if len(values) < 2:
        return ""
    known = sorted(v for v in values if v is not None)
    never = len(values) - len(known)
    span = f"{known[0]:{spec}}–{known[-1]:{spec}}" if known else "never"
    return f" ({span}{f', {never} never' if never and known else ''}; {len(values)} seeds)"


def _times(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}"


def _reach(seconds: float | None, samples: float | None) -> str:
    if samples is None:
        return "never"
    return f"{seconds:.1f} s / {samples:.0f}" if seconds is not None else f"— / {samples:.0f}"


# -- figure ----------------------------------------------------------------------------------
def plot(study: Mapping[str, Any], plot_dir: Path) -> list[Path]:
    """Per model: held-out loss against wall time, one panel per P, 1F1B's final loss dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates, warm_rates = _rates(study)
    grouped = _group(study)
    written = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for model in dict.fromkeys(m for m, _ in grouped):
        panels_of = sorted(r for m, r in grouped if m == model)
        figure, panels = plt.subplots(1, len(panels_of), figsize=(6.5 * len(panels_of), 4.8),
                                      squeeze=False)
        for panel, ranks in zip(panels[0], panels_of):
            for label, runs in grouped[model, ranks].items():
                rate = rates.get((model, ranks, label))
                if rate is None:
                    continue
                xs, ys = mean_curve(runs)
                seconds = [seconds_for(x, rate, warm_rates.get((model, ranks, label)),
                                       _warm_samples(runs[0])) for x in xs]
                if None in seconds:
                    continue
                panel.plot(seconds, ys, label=f"{label} ({rate:.0f} samples/s)",
                           color="black" if label == BASELINE else None, linewidth=1.4)
                if label == BASELINE:
                    panel.axhline(ys[-1], color="black", linestyle="--", linewidth=0.8)
            panel.set_title(f"P = {ranks}")
            panel.set_xlabel(f"wall time (s): {ranks} processes on a shared 2-core machine")
            panel.set_ylabel("held-out loss")
            panel.grid(alpha=0.3)
            panel.legend(fontsize=8)
        title = MODELS[model].title if model in MODELS else model
        figure.suptitle(f"{title}: held-out loss vs wall time (dashed: 1F1B's final loss)")
        figure.tight_layout()
        path = plot_dir / f"time_to_loss_{model}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


# -- the study, in parts ---------------------------------------------------------------------
def load(path: Path, resume: bool) -> dict[str, Any]:
    """The study so far (``resume``) or a new one."""
    if resume and path.exists():
        study: dict[str, Any] = json.loads(path.read_text())
        return study
    return {"settings": {"microbatches": cv.MICROBATCHES, "optimizers": OPTIMIZERS,
                         "ladder": list(LADDER), "torch": torch.__version__,
                         "models": {k: asdict(c) for k, c in MODELS.items()}, "parts": []},
            "runs": [], "timing": []}


def save(study: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(study, indent=1) + "\n")


def run_study(study: dict[str, Any], cases: Sequence[cv.Case], methods: Sequence[MethodRow], *,
              ranks: Sequence[int], seeds: Sequence[int], batches: Mapping[str, int],
              repeats: int, path: Path, reuse: Sequence[Mapping[str, Any]] = (),
              train_too: bool = True, timed: int = TIMED_STEPS,
              eval_points: Mapping[str, int] | None = None) -> None:
    """Add every missing timing and run to ``study``, saving it to ``path`` after each step.

    A timing missing here is copied from ``reuse`` (another result file's timings) when that
    has one for the same model, ranks and method, else measured."""
    have_runs = {(r["model"], r["ranks"], r["method"], r["seed"], r["batches"]) for r in study["runs"]}
    for case in cases:
        every = -(-batches[case.key] // (eval_points or {}).get(case.key, EVAL_POINTS))
        for p in ranks:
            have = {(t["model"], t["ranks"], t["method"]) for t in study["timing"]}
            missing = [m for m in methods if (m.timed_as is None or m.options.get("warmup"))
                       and (case.key, p, m.label) not in have]
            for method in list(missing):
                copied = [t for t in reuse if (t["model"], t["ranks"], t["method"])
                          == (case.key, p, method.label) and "samples_per_second" in t]
                if copied:
                    study["timing"].append({**copied[0], "source": "reused: "
                                            + copied[0].get("source", "another result file")})
                    missing.remove(method)
            for record in time_methods(case, missing, p, repeats, timed) if missing else []:
                study["timing"].append(record)
                _report(record)
            save(study, path)
            for method in methods if train_too else ():
                for seed in seeds:
                    if (case.key, p, method.label, seed, batches[case.key]) in have_runs:
                        continue
                    copy = _same_at_other_ranks(study["runs"], case.key, method, seed,
                                                batches[case.key])
                    study["runs"].append({**copy, "ranks": p, "copied_from_ranks": copy["ranks"]}
                                         if copy else
                                         train(case, method, p, seed, batches[case.key], every))
                    _report(study["runs"][-1])
                    save(study, path)


RANK_FREE = frozenset({"1f1b", "2bw"})
"""Schedules whose numbers do not depend on P (uniform stages, no options): 1F1B computes the
non-pipelined gradients, 2BW every stage's one version behind; their runs at P = 2 and 4 were
bit for bit equal (``benchmarks/results/time_to_loss.json``), so one run serves every P."""


def _same_at_other_ranks(runs: Sequence[Mapping[str, Any]], model: str, method: MethodRow,
                         seed: int, batches: int) -> Mapping[str, Any] | None:
    """A finished run of a :data:`RANK_FREE` method at other ranks, to copy (None: train)."""
    if method.schedule not in RANK_FREE or method.options or method.optimizer:
        return None
    return next((r for r in runs if (r["model"], r["method"], r["seed"], r["batches"])
                 == (model, method.label, seed, batches) and "heldout_loss" in r
                 and "copied_from_ranks" not in r), None)


def _report(record: Mapping[str, Any]) -> None:
    head = f"  {record['model']:9} P={record['ranks']} {record['method']:12}"
    if "skipped" in record or "diverged" in record:
        print(f"{head} {'skipped' if 'skipped' in record else 'DIVERGED'}: "
              f"{record.get('skipped', record.get('diverged'))}", flush=True)
    elif "samples_per_second" in record:
        print(f"{head} {record['samples_per_second']:8.1f} samples/s", flush=True)
    else:
        print(f"{head} seed {record['seed']}: held-out {record['heldout_loss'][0]:.3f} -> "
              f"{record['heldout_loss'][-1]:.3f} ({record['local_seconds']:.0f} s)", flush=True)


def replace_timings(study: dict[str, Any], timings: Sequence[Mapping[str, Any]],
                    source: str) -> None:
    """Put ``timings`` (measured samples/s) in place of ``study``'s for the same model, ranks
    and method; each the best of its repeats, as :func:`time_methods` takes it."""
    new = {(t["model"], t["ranks"], t["method"]): {**t, "samples_per_second": max(
        r["samples_per_second"] for r in t["repeats"])} if t.get("repeats") else t
        for t in timings if "samples_per_second" in t}
    study["timing"] = [t for t in study["timing"]
                       if (t["model"], t["ranks"], t["method"]) not in new]
    study["timing"] += [{**t, "source": f"{t.get('source', 'measured')} ({source})"}
                        for t in new.values()]


def merge(study: dict[str, Any], part: Mapping[str, Any]) -> int:
    """Add ``part``'s runs and timings that ``study`` lacks (parts run side by side, each to its
    own file); returns how many were added."""
    def run_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return r["model"], r["ranks"], r["method"], r["seed"], r["batches"]

    def timing_key(t: Mapping[str, Any]) -> tuple[Any, ...]:
        return t["model"], t["ranks"], t["method"]
    runs = {run_key(r) for r in study["runs"]}
    timings = {timing_key(t) for t in study["timing"] if "samples_per_second" in t}
    new_runs = [r for r in part["runs"] if run_key(r) not in runs]
    new_timings = [t for t in part["timing"]
                   if "samples_per_second" in t and timing_key(t) not in timings]
    study["runs"] += new_runs
    study["timing"] += new_timings
    return len(new_runs) + len(new_timings)


def _check_identity(study: dict[str, Any]) -> None:
    """Mark each timing whose multi-process losses equal the single-process run's start."""
    for timing in study["timing"]:
        local = [r for r in study["runs"] if (r["model"], r["ranks"], r["method"], r["seed"])
                 == (timing["model"], timing["ranks"], timing["method"], 0) and "train_loss" in r
                 and "copied_from_ranks" not in r]
        if local and timing.get("train_loss"):
            count = len(timing["train_loss"])
            timing["bit_identical_to_local"] = local[0]["train_loss"][:count] == timing["train_loss"]


# -- command line ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    labels = [m.label for m in METHODS]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"short runs ({QUICK}), one short timing each (or an earlier "
                             f"study's, benchmarks/results/time_to_loss*.json, where one has it); "
                             f"JSON to {QUICK_JSON.relative_to(ROOT)}, no figures")
    parser.add_argument("--models", nargs="+", default=None, choices=list(MODELS),
                        help="default: gpt-tiny gpt-small (the CNN on request)")
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--methods", nargs="+", default=None, choices=labels,
                        help=f"default: all (--quick: {' '.join(BASE_METHODS)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--updates", type=int, default=None,
                        help="batches of U samples per run (default: each model's)")
    parser.add_argument("--timing-repeats", type=int, default=None, help="default 2 (quick: 1)")
    parser.add_argument("--timing-only", action="store_true",
                        help="measure the missing samples/s, train nothing (with --resume: a "
                             "first part of the study)")
    parser.add_argument("--timing-from", type=Path, default=None, metavar="FILE",
                        help="take the samples/s of FILE (a --timing-only result) in place of "
                             "this study's, for the same model, ranks and method")
    parser.add_argument("--merge", type=Path, nargs="+", default=[], metavar="FILE",
                        help="add the runs and timings of these result files (parts run side "
                             "by side) that this one lacks")
    parser.add_argument("--resume", action="store_true",
                        help="add to the result file's runs and timings instead of starting anew")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help=f"default {DEFAULT_PLOTS.relative_to(ROOT)} (none with --quick)")
    args = parser.parse_args(argv)
    cases = [MODELS[k] for k in (args.models or ["gpt-tiny", "gpt-small"])]
    batches = {c.key: args.updates or (QUICK[c.key][0] if args.quick else c.updates)
               for c in cases}
    methods = args.methods or (BASE_METHODS if args.quick else labels)
    path = args.json_out or (QUICK_JSON if args.quick else DEFAULT_JSON)
    study = load(path, args.resume)
    for part in args.merge:
        print(f"{merge(study, json.loads(part.read_text()))} runs and timings from {part}")
    if args.timing_from is not None:
        replace_timings(study, json.loads(args.timing_from.read_text())["timing"],
                        f"from {args.timing_from.name}")
    started = time.perf_counter()
    reuse = [t for found in sorted(DEFAULT_JSON.parent.glob("time_to_loss*.json"))
             if args.quick and found != path and found != QUICK_JSON
             for t in json.loads(found.read_text())["timing"]]
    run_study(study, cases, [m for m in METHODS if m.label in methods], ranks=args.ranks,
              seeds=args.seeds, batches=batches, path=path, reuse=reuse,
              train_too=not args.timing_only, timed=QUICK_TIMED if args.quick else TIMED_STEPS,
              eval_points={k: v[1] for k, v in QUICK.items()} if args.quick else None,
              repeats=args.timing_repeats or (1 if args.quick else 2))
    _check_identity(study)
    study["settings"]["parts"].append({"argv": sys.argv[1:] if argv is None else argv,
                                       "seconds": time.perf_counter() - started})
    study["summary"] = time_to_loss_rows(study)
    save(study, path)
    print(markdown(study["summary"]))
    print(f"\n{time.perf_counter() - started:.0f} s; wrote {path}")
    plot_dir = args.plot_dir or (None if args.quick else DEFAULT_PLOTS)
    if plot_dir is not None:
        for written in plot(study, plot_dir):
            print(f"wrote {written}")
    return study


if __name__ == "__main__":
    main()
