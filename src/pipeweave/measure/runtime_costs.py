"""Measure the runtime's fixed costs per action against a profile
(:mod:`pipeweave.profiler.runtime_costs`).

A few short runs of the real runtime in one process (the single-process executor: the same
stage code as a distributed run, messages through in-memory mailboxes) on splits of the
model with one block per stage and with about half the model per stage, under 1F1B (whole
backwards) and ZB-H1 (the split ``I`` and ``W``). For every compute action of the timed
iterations::

    extra = measured duration - sum of its stage's blocks' profiled times

and per kind a least-squares line ``extra = per_action + per_block * (k - 1)`` through the
medians per stage (``k`` blocks in the stage). ``per_message`` is the median time of a posted
send. The profile must be of the same model at the micro-batch the runs use (its
``batch_size``), timed with the same intra-op threads as one rank (a run of two or more
stages uses one thread per rank on a two-core machine, as the profiler did).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..profiler import Profile
from ..profiler.runtime_costs import ACTION_KINDS, RuntimeCosts
from ..runtime.job import BuiltinModel, Job, OptimizerFactory
from ..runtime.launch.single_process import run_local

__all__ = ["measure_runtime_costs", "fit_runtime_costs"]

_ACTION = re.compile(r"^(\d+)([A-Z]+)")
_KINDS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad", "U": "update"}


def _splits(blocks: int) -> list[tuple[tuple[int, int], ...]]:
    """One block per stage (at most 8 stages: the first blocks), and the model in two halves."""
    out: list[tuple[tuple[int, int], ...]] = []
    if blocks >= 2:
        count = min(blocks, 8)
        singles = [(i, i + 1) for i in range(count - 1)] + [(count - 1, blocks)]
        out.append(tuple(singles))
        half = blocks // 2
        if half > 1 or blocks - half > 1:
            out.append(((0, half), (half, blocks)))
    return out


def fit_runtime_costs(samples: Sequence[tuple[str, int, float]], *,
                      messages: Sequence[float] = (),
                      notes: dict[str, Any] | None = None) -> RuntimeCosts:
    """Fit ``extra = per_action + per_block (k - 1)`` per kind through ``(kind, k, extra)``
    samples (one per stage and kind: the median over its actions); ``messages``: send times."""
    per_action: dict[str, float] = {}
    per_block: dict[str, float] = {}
    by_kind: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for kind, blocks, extra in samples:
        if kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {kind!r}; known: {list(ACTION_KINDS)}")
        by_kind[kind].append((blocks, extra))
    for kind, points in by_kind.items():
        xs = [float(k - 1) for k, _ in points]
        ys = [e for _, e in points]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
        per_action[kind] = mean_y - slope * mean_x
        per_block[kind] = slope
    return RuntimeCosts(per_action=per_action, per_block=per_block,
                        per_message=statistics.median(messages) if messages else 0.0,
                        notes=notes or {})


def measure_runtime_costs(profile: Profile, *, model: str, overrides: dict[str, Any] | None = None,
                          seq_len: int | None = None, optimizer: str = "adam",
                          microbatches: int = 4, warmup: int = 2, iterations: int = 4,
                          say: Callable[[str], None] | None = None) -> RuntimeCosts:
    """Run ``model`` (a registered name) and fit its :class:`RuntimeCosts` (module docstring)."""
    from ..planner.plan import Plan

    if profile.batch_size is None:
        raise ValueError("measuring runtime costs needs a profile with its batch_size (the "
                         "micro-batch the runs use); profile with `pipeweave profile`")
    if warmup < 1 or iterations < 1:
        raise ValueError(f"need warmup >= 1 and iterations >= 1, got {warmup} and {iterations}")
    builtin = BuiltinModel(model, seed=0, overrides=dict(overrides or {}))
    spec = builtin()
    if len(spec.blocks) != profile.num_blocks:
        raise ValueError(f"the profile has {profile.num_blocks} blocks but model {model!r} has "
                         f"{len(spec.blocks)}; profile this model first")
    data = builtin.data(profile.batch_size * microbatches, seq_len=seq_len)
    samples: list[tuple[str, int, float]] = []
    messages: list[float] = []
    runs = 0
    for bounds in _splits(profile.num_blocks):
        for schedule in ("1f1b", "zb-h1"):
            plan = Plan(num_blocks=profile.num_blocks, stages=bounds, schedule=schedule,
                        microbatches=microbatches)
            job = Job(plan=plan, steps=warmup + iterations, model=builtin,
                      optimizer=OptimizerFactory(optimizer, {"lr": 1e-4}), seed=0, data=data)
            records = [r for result in run_local(job) for r in result.records]
            runs += 1
            durations: dict[tuple[int, str], list[float]] = defaultdict(list)
            for _rank, text, start, end in records:
                match = _ACTION.match(text)
                if match is not None:
                    durations[(int(match.group(1)), match.group(2))].append(end - start)
            for (stage, code), times in durations.items():
                timed = times[len(times) * warmup // (warmup + iterations):]
                if code in ("SF", "SB"):
                    messages.extend(timed)
                kind = _KINDS.get(code)
                if kind is None or not timed:
                    continue
                first, end = bounds[stage]
                profiled = sum(getattr(b, kind) for b in profile.blocks[first:end])
                samples.append((kind, end - first, statistics.median(timed) - profiled))
            if say is not None:
                say(f"runtime costs: ran {schedule} over {len(bounds)} stages")
    return fit_runtime_costs(samples, messages=messages, notes={
        "runs": runs, "microbatches": microbatches, "iterations": iterations,
        "executor": "single-process"})
