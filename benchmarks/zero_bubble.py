"""Benchmark: zero-bubble schedules (issue 15) in pipeweave and in torch.distributed.pipelining.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/zero_bubble.py
        [--repeats 3] [--steps 12] [--ranks 2] [--cases gpt]
        [--pairs 1f1b zb-h1 zb-h2 interleaved-1f1b interleaved-zb zbv dualpipev]
        [--quiet-wait 30] [--json-out benchmarks/results/zero_bubble.json]

Each pair is a pipeweave schedule and its torch twin, training the SAME model (pipeweave's
built-in GPT) cut into the SAME blocks (``Plan.uniform``) with the same batch, micro-batch
count M, plain SGD, steps, seed and data, one process per rank (gloo, ONE intra-op thread,
P = 2 ranks on a 2-core machine); the measurement harness is ``vs_torch_pipelining.py``'s::

    pipeweave          torch.distributed.pipelining     stages per rank (P = 2)
    1f1b               Schedule1F1B                      1                 ranks 0 1
    zb-h1, zb-h2       (no single-stage twin)            1                 ranks 0 1
    interleaved-1f1b   ScheduleInterleaved1F1B           2, looped         ranks 0 1 0 1
    interleaved-zb     ScheduleInterleavedZeroBubble     2, looped         ranks 0 1 0 1
    zbv                ScheduleZBVZeroBubble             2, in a V         ranks 0 1 1 0
    dualpipev          ScheduleDualPipeV                 2, in a V         ranks 0 1 1 0

(the last column: the rank of stage 0, 1, ... . torch has no ZB-H1/ZB-H2 for one stage per
rank, so those two rows compare with pipeweave's own 1f1b only). A pipeweave schedule that is
not registered (``pipeweave.schedules.available_schedules()``), or a class this torch lacks,
is reported "not available"; a run that fails is reported with its error; neither stops the
benchmark.

Per row: steady-state throughput (batch size over the median iteration time of iterations
2..K; the median over ``--repeats`` runs, all units of a repeat in turn, the order reversed
every other repeat), its ratio to the torch twin and to pipeweave's own ``1f1b``, peak RSS
per rank, and what the simulator predicts for the pipeweave schedule:
``simulate(make_schedule(plan, steps), plan_costs(profile, plan.stages))`` with the profile
of the same model measured at the start (one micro-batch, one thread, per-block forward,
backward and weight-gradient times), its iteration time, its speed-up over ``1f1b``, and
its held activations per rank against what each run measured: the most micro-batches whose
activations a rank held at once over all its chunks (F until W, or B),
``RankResult.peak_stashed_microbatches`` beside the simulator's ``peak_activations``. Both
sides must train: the first
iteration's loss agrees with the torch twin's and pipeweave 1f1b's (same weights and data
before any update) and the loss goes down.

Quiet machine: as in ``vs_torch_pipelining.py``, each run waits (up to ``--quiet-wait`` s)
for the CPUs to be mostly idle and a run that other processes disturbed is redone (up to
``RETRIES`` times); the JSON records the busy share, foreign load and attempts per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from torch_pipelining_worker import TORCH_SCHEDULES, TorchSide, launch as launch_torch  # noqa: E402
from vs_torch_pipelining import (  # noqa: E402
    CASES as TORCH_CASES, MAX_FOREIGN, QUIET_BUSY, QUIET_WAIT_S, RETRIES, Case, Run, case_job,
    num_blocks, steady_throughput,
)

import torch  # noqa: E402
import torch.distributed.pipelining as torch_pipelining  # noqa: E402

from pipeweave.planner.evaluate import plan_costs  # noqa: E402
from pipeweave.profiler import Profile  # noqa: E402
from pipeweave.profiler.measure import profile_builtin  # noqa: E402
from pipeweave.runtime import Plan, launch_local  # noqa: E402
from pipeweave.runtime.execution.parts import make_schedule  # noqa: E402
from pipeweave.runtime.observation.summary import summarize  # noqa: E402
from pipeweave.schedules import available_schedules  # noqa: E402
from pipeweave.sim import simulate  # noqa: E402

# -- settings -------------------------------------------------------------------------------
STEPS = 12            # iterations per run; the first is warm-up and is not timed
REPEATS = 3           # runs per unit (schedule x side); the table shows the median
RANKS = 2             # P: one process per core, one intra-op thread each
BASELINE = "1f1b"     # pipeweave's own reference, always run
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "zero_bubble.json"


@dataclass(frozen=True)
class Pair:
    """A pipeweave schedule, its torch twin and how the chunks sit on the ranks."""

    schedule: str
    """pipeweave schedule name (``pipeweave schedules``)."""
    torch: str | None
    """Key of ``TORCH_SCHEDULES`` (the torch class); None: no twin."""
    chunks: int = 1
    """Stages per rank, on both sides."""
    placement: str = "loop"
    """Where torch's schedule puts a rank's chunks: ``"loop"`` (r, r+P) or ``"v"`` (r, 2P-1-r)."""


PAIRS = {pair.schedule: pair for pair in (
    Pair("1f1b", "1f1b"),
    Pair("zb-h1", None),
    Pair("zb-h2", None),
    Pair("interleaved-1f1b", "interleaved-1f1b", chunks=2),
    Pair("interleaved-zb", "interleaved-zb", chunks=2),
    Pair("zbv", "zbv", chunks=2, placement="v"),
    Pair("dualpipev", "dualpipev", chunks=2, placement="v"),
)}

CASES = {
    # 10 blocks: embed, (attn, ffn) x 4, head; as vs_torch_pipelining's "gpt" (8 sequences
    # per micro-batch) but M = 8, so the warm-up and cool-down the zero-bubble schedules fill
    # are a visible share of the iteration at P = 2, and M is a multiple of P and >= 2P
    # (interleaving and DualPipeV need it).
    "gpt": Case("gpt d128 L4 T64", "gpt-tiny",
                {"d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512, "seq_len": 64},
                dataset="stdlib-bytes", seq_len=64, batch_size=64, microbatches=8, lr=0.01),
    # Hugging Face's GPT2LMHeadModel (pipeweave.hf, untied, attention and MLP halves: 10
    # blocks) at the "gpt" case's shape and M; torch runs the same blocks (issue 17's row).
    "hf-gpt2": Case("HF GPT-2 d128 L4 T64", "hf-gpt2", TORCH_CASES["hf-gpt2"].overrides,
                    dataset="stdlib-bytes-labels", seq_len=64, batch_size=64, microbatches=8,
                    lr=0.01),
    # For the smoke test (tests/benchmarks): 6 blocks, so four stages of one or two blocks.
    "tiny": Case("gpt d32 L2 T16", "gpt-tiny", TORCH_CASES["tiny"].overrides,
                 dataset="stdlib-bytes", seq_len=16, batch_size=8, microbatches=4, lr=0.05),
}
DEFAULT_CASES = ("gpt",)

NOT_AVAILABLE = "not available"


@dataclass
class PipeweaveRun(Run):
    peak_stashed: list[int] = field(default_factory=list)
    """Per rank: most micro-batches one of its stages held at once (F until W or B)."""


def error_text(error: BaseException) -> str:
    """The last line of an error (a child's traceback ends with its own message)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:500]


# -- plans and the simulator ------------------------------------------------------------------
def plan_for(case: Case, pair: Pair, ranks: int) -> Plan:
    return Plan.uniform(num_blocks(case), ranks, chunks=pair.chunks, schedule=pair.schedule,
                        microbatches=case.microbatches)


def torch_side(case: Case, pair: Pair, ranks: int, steps: int) -> TorchSide:
    assert pair.torch is not None
    stages = Plan.uniform(num_blocks(case), ranks, chunks=pair.chunks).stages
    return TorchSide(model=case.model, overrides=case.overrides, stages=stages,
                     schedule=pair.torch, microbatches=case.microbatches,
                     batch_size=case.batch_size, seq_len=case.seq_len, dataset=case.dataset,
                     steps=steps, lr=case.lr, chunks=pair.chunks, placement=pair.placement)


def simulated(case: Case, pair: Pair, ranks: int, steps: int, profile: Profile) -> dict[str, Any]:
    """The simulator's prediction for ``pair``'s pipeweave schedule, and its placement."""
    plan = plan_for(case, pair, ranks)
    schedule = make_schedule(plan, steps)
    result = simulate(schedule, plan_costs(profile, plan.stages))
    return {"iteration_ms": 1e3 * result.iteration_time,
            "samples_per_second": case.batch_size / result.iteration_time,
            "bubble_fraction": result.bubble_fraction,
            "peak_activations": list(result.peak_activations),
            "stage_ranks": [ranks_of[0] for ranks_of in schedule.layout.stage_ranks]}


def profile_case(case: Case) -> Profile:
    """Every block on one micro-batch, one thread (what a rank runs), plain SGD's step."""
    return profile_builtin(case.model, batch_size=case.batch_size // case.microbatches,
                           seq_len=case.seq_len, overrides=dict(case.overrides), threads=1,
                           optimizer="sgd")


# -- one run of each side ---------------------------------------------------------------------
def run_pipeweave(case: Case, pair: Pair, ranks: int, steps: int) -> Run:
    plan = plan_for(case, pair, ranks)
    results = launch_local(case_job(case, plan, steps))
    summary = summarize(results, schedule=pair.schedule, steps=steps,
                        batch_size=case.batch_size, microbatches=case.microbatches)
    ends = summary.iteration_end_s
    return PipeweaveRun(steady_throughput(ends, case.batch_size), summary.peak_memory_bytes,
                        summary.losses, ends,
                        peak_stashed=list(summary.peak_stashed_microbatches))


def run_torch(case: Case, pair: Pair, ranks: int, steps: int) -> Run:
    results = launch_torch(torch_side(case, pair, ranks, steps))
    ends = [max(r.iteration_end_s[k] for r in results) for k in range(steps)]
    losses = next(r.losses for r in results if r.losses)  # the rank holding the last stage
    return Run(steady_throughput(ends, case.batch_size), [r.peak_memory_bytes for r in results],
               losses, ends)


def measured(runner: Callable[[], Run], quiet_wait_s: float) -> Run:
    """One run on a quiet machine, redone if other processes disturbed it."""
    for attempt in range(1, RETRIES + 2 if quiet_wait_s > 0 else 2):
        busy = wait_for_quiet(quiet_wait_s, QUIET_BUSY) if quiet_wait_s > 0 else 0.0
        with ForeignLoad() as load:
            run = runner()
        run.busy_before, run.foreign, run.attempts = busy, load.share, attempt
        if load.share <= MAX_FOREIGN or busy > QUIET_BUSY:
            break  # clean, or the machine never went quiet: retrying won't help
    return run


# -- the comparison ---------------------------------------------------------------------------
@dataclass
class Unit:
    """One side of one pair: what it is, whether it can run, and its runs."""

    pair: Pair
    side: str
    """``"pipeweave"`` or ``"torch"``."""
    status: str = "ok"
    error: str | None = None
    runs: list[Run] = field(default_factory=list)


def units_for(pairs: list[Pair], registered: set[str]) -> list[Unit]:
    units = []
    for pair in pairs:
        unit = Unit(pair, "pipeweave")
        if pair.schedule not in registered:
            unit.status, unit.error = NOT_AVAILABLE, (
                f"pipeweave has no schedule {pair.schedule!r} registered")
        units.append(unit)
        if pair.torch is None:
            continue
        unit = Unit(pair, "torch")
        if not hasattr(torch_pipelining, TORCH_SCHEDULES[pair.torch]):
            unit.status, unit.error = NOT_AVAILABLE, (
                f"torch {torch.__version__} has no {TORCH_SCHEDULES[pair.torch]}")
        units.append(unit)
    return units


def compare(case: Case, pairs: list[Pair], ranks: int, steps: int, repeats: int,
            quiet_wait_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Profile, simulate, then ``repeats`` rounds over every runnable unit; one row per pair,
    and the block times the simulator used."""
    units = units_for(pairs, {info.name for info in available_schedules()})
    busy = wait_for_quiet(quiet_wait_s, QUIET_BUSY) if quiet_wait_s > 0 else None
    profile = profile_case(case)
    predictions: dict[str, dict[str, Any]] = {}
    for unit in units:
        if unit.side == "pipeweave" and unit.status == "ok":
            try:
                predictions[unit.pair.schedule] = simulated(case, unit.pair, ranks, steps, profile)
            except Exception as error:  # a plan or schedule this shape cannot have
                unit.status, unit.error = "failed", error_text(error)
    run_rounds(units, case, ranks, steps, repeats, quiet_wait_s)
    sides = {(u.pair.schedule, u.side): side_summary(u, case, ranks) for u in units}
    rows = [make_row(case, pair, ranks, steps, sides, predictions) for pair in pairs]
    return rows, {**profile_summary(profile), "busy_before": busy}


def run_rounds(units: list[Unit], case: Case, ranks: int, steps: int, repeats: int,
               quiet_wait_s: float) -> None:
    """``repeats`` rounds over the runnable units, every other round in reverse order; a
    unit that fails is reported with its error and not run again."""
    for repeat in range(repeats):
        for unit in units if repeat % 2 == 0 else list(reversed(units)):
            if unit.status != "ok":
                continue  # not available, or failed in an earlier round
            runner = run_pipeweave if unit.side == "pipeweave" else run_torch
            started = time.perf_counter()
            try:
                unit.runs.append(measured(partial(runner, case, unit.pair, ranks, steps),
                                          quiet_wait_s))
            except Exception as error:
                unit.status, unit.error = "failed", error_text(error)
            done = (f"{unit.runs[-1].samples_per_second:.1f} samples/s" if unit.status == "ok"
                    else unit.error)
            print(f"  [{repeat + 1}/{repeats}] {unit.pair.schedule} {unit.side}: {done} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)


def make_row(case: Case, pair: Pair, ranks: int, steps: int,
             sides: dict[tuple[str, str], dict[str, Any]],
             predictions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``pair``'s sides, the simulator's prediction, the ratios and the training check."""
    pw = sides[(pair.schedule, "pipeweave")]
    th = sides.get((pair.schedule, "torch"), {"class": None, "status": "no twin", "error": None})
    baseline = sides.get((BASELINE, "pipeweave"))
    sim = predictions.get(pair.schedule)
    if sim is not None and BASELINE in predictions:
        sim["speedup_vs_1f1b"] = predictions[BASELINE]["iteration_ms"] / sim["iteration_ms"]
    row: dict[str, Any] = {
        "case": case.label, "schedule": pair.schedule, "ranks": ranks, "chunks": pair.chunks,
        "pipeweave": pw, "torch": th, "simulated": sim,
        "throughput_ratio_vs_torch": ratio(pw, th),
        "throughput_ratio_vs_pipeweave_1f1b": ratio(pw, baseline),
        "torch_ratio_vs_torch_1f1b": ratio(th, sides.get((BASELINE, "torch"))),
    }
    if pair.torch is not None:
        side = torch_side(case, pair, ranks, steps)
        row["torch_stage_ranks"] = [next(r for r in range(ranks) if s in side.stages_of(r))
                                    for s in range(len(side.stages))]
        # both sides hold the same blocks on the same rank (pipeweave's layout is its schedule's)
        row["same_placement"] = sim is not None and sim["stage_ranks"] == row["torch_stage_ranks"]
    if sim is not None and ok(pw):
        row["simulator_error"] = abs(sim["iteration_ms"] - pw["iteration_ms"]) / pw["iteration_ms"]
    row["both_train"] = trains(pw, th, baseline)
    return row


def ok(side: dict[str, Any] | None) -> bool:
    return side is not None and side["status"] == "ok"


def ratio(side: dict[str, Any], reference: dict[str, Any] | None) -> float | None:
    if not ok(side) or not ok(reference):
        return None
    assert reference is not None
    return side["samples_per_second"] / reference["samples_per_second"]


def trains(pw: dict[str, Any], th: dict[str, Any], baseline: dict[str, Any] | None) -> bool | None:
    """The loss falls on every side that ran, and the first iteration's loss (before any
    update) agrees with the torch twin's and pipeweave 1f1b's."""
    ran = [side for side in (pw, th) if ok(side)]
    if not ran:
        return None
    references = [baseline] if baseline is not None and ok(baseline) else []
    first = [side["losses"][0] for side in [*ran, *references]]
    agree = max(first) - min(first) < 1e-3 * abs(first[0])
    return bool(agree and all(side["losses"][-1] < side["losses"][0] for side in ran))


def side_summary(unit: Unit, case: Case, ranks: int) -> dict[str, Any]:
    """Medians over the unit's runs, memory, losses; status and error."""
    summary: dict[str, Any] = {"status": unit.status, "error": unit.error}
    if unit.side == "pipeweave":
        summary["schedule"] = unit.pair.schedule
    else:
        summary["class"] = TORCH_SCHEDULES[unit.pair.torch] if unit.pair.torch else None
    runs = unit.runs
    if unit.status != "ok" or not runs:
        return summary
    throughput = statistics.median(r.samples_per_second for r in runs)
    summary.update({
        "samples_per_second": throughput,
        "iteration_ms": 1e3 * case.batch_size / throughput,  # the median iteration's time
        "samples_per_second_runs": [r.samples_per_second for r in runs],
        "busy_before_runs": [round(r.busy_before, 3) for r in runs],
        "foreign_load_runs": [round(r.foreign, 3) for r in runs],
        "attempts_runs": [r.attempts for r in runs],
        "peak_rss_bytes": [max(r.peak_rss_bytes[rank] for r in runs) for rank in range(ranks)],
        "losses": runs[0].losses,
    })
    if isinstance(runs[0], PipeweaveRun):
        summary["peak_stashed_microbatches"] = runs[0].peak_stashed
    return summary


# -- output -----------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> str:
    """One line per pair; ``n/a`` where a side is not available or failed (notes below)."""
    mib = 2**20

    def num(value: float | None, fmt: str, suffix: str = "") -> str:
        return "n/a" if value is None else format(value, fmt) + suffix

    def per_rank(values: list[float] | None, fmt: str = ".0f") -> str:
        return "n/a" if not values else "/".join(format(v, fmt) for v in values)

    head = (f"{'case':<16} {'schedule':<16} {'torch Schedule..':<21} | {'pipeweave':>9} "
            f"{'torch':>9} {'vs torch':>8} {'vs 1f1b':>7} {'th x':>6} | {'sim ms':>7} "
            f"{'meas ms':>7} {'sim x':>6} | {'held':>5} {'sim':>5} | "
            f"{'pw RSS MiB':>11} {'th RSS MiB':>11} | {'loss1':>7} {'lossK':>7} {'ok':>3}")
    lines = [head,
             " " * 57 + "samples/s (median of runs)" + " " * 12 + "pipeweave iteration      "
             "activations/rank peak per rank",
             "-" * len(head)]
    notes = []
    for r in rows:
        pw, th, sim = r["pipeweave"], r["torch"], r["simulated"] or {}
        running = pw if ok(pw) else th
        losses = running.get("losses") or [None, None]
        check = {True: "yes", False: "NO", None: "-"}[r["both_train"]]
        twin = th["class"].removeprefix("Schedule") if th["class"] else "(no twin)"
        lines.append(
            f"{r['case']:<16} {r['schedule']:<16} {twin:<21} | "
            f"{num(pw.get('samples_per_second'), '.1f'):>9} "
            f"{num(th.get('samples_per_second'), '.1f'):>9} "
            f"{num(r['throughput_ratio_vs_torch'], '.2f', 'x'):>8} "
            f"{num(r['throughput_ratio_vs_pipeweave_1f1b'], '.2f', 'x'):>7} "
            f"{num(r['torch_ratio_vs_torch_1f1b'], '.2f', 'x'):>6} | "
            f"{num(sim.get('iteration_ms'), '.1f'):>7} {num(pw.get('iteration_ms'), '.1f'):>7} "
            f"{num(sim.get('speedup_vs_1f1b'), '.2f', 'x'):>6} | "
            f"{per_rank(pw.get('peak_stashed_microbatches')):>5} "
            f"{per_rank(sim.get('peak_activations'), 'g'):>5} | "
            f"{per_rank([b / mib for b in pw.get('peak_rss_bytes', [])]):>11} "
            f"{per_rank([b / mib for b in th.get('peak_rss_bytes', [])]):>11} | "
            f"{num(losses[0], '.4f'):>7} {num(losses[-1], '.4f'):>7} {check:>3}")
        for name, side in (("pipeweave", pw), ("torch", th)):
            if side["status"] in (NOT_AVAILABLE, "failed"):
                notes.append(f"  {r['schedule']} ({name}): {side['status']}: {side['error']}")
        if r.get("same_placement") is False and sim:
            notes.append(f"  {r['schedule']}: pipeweave places stages on ranks "
                         f"{sim['stage_ranks']}, torch on {r['torch_stage_ranks']}")
    lines += ["", "vs torch: pipeweave / the torch twin; vs 1f1b: pipeweave / pipeweave 1f1b; "
              "th x: torch / torch Schedule1F1B; sim x: simulated speed-up over 1f1b;",
              "held: most micro-batches a rank held activations of at once, all its chunks "
              "(runtime), sim: the same simulated",
              "ok: first loss agrees with torch and pipeweave 1f1b, and the loss falls"]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def write_results(path: Path, args: argparse.Namespace, rows: list[dict[str, Any]],
                  profiles: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "settings": {"steps": args.steps, "repeats": args.repeats, "ranks": args.ranks,
                     "threads_per_rank": 1, "backend": "gloo",
                     "pairs": {name: asdict(PAIRS[name]) for name in args.pairs},
                     "cases": {name: vars(CASES[name]) for name in args.cases}},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "profiles": profiles,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {path}")


def profile_summary(profile: Profile) -> dict[str, Any]:
    """Per block, the times the simulator used (ms)."""
    return {"blocks": [{"name": b.name, "forward_ms": 1e3 * b.forward,
                        "backward_ms": 1e3 * b.backward, "weight_grad_ms": 1e3 * b.weight_grad,
                        "update_ms": 1e3 * b.update} for b in profile.blocks],
            "batch_size": profile.batch_size}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS),
                        help=f"pipeweave schedules to run ({BASELINE} always runs: the reference)")
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S,
                        help="seconds to wait for an idle machine before each run (0: don't)")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: need >= 3 (one warm-up plus two timed iterations)")
    if args.repeats < 1 or args.ranks < 2:
        parser.error(f"need --repeats >= 1 and --ranks >= 2, got {args.repeats} and {args.ranks}")
    if BASELINE not in args.pairs:
        args.pairs.insert(0, BASELINE)
    pairs = [PAIRS[name] for name in args.pairs]
    rows: list[dict[str, Any]] = []
    profiles: dict[str, dict[str, Any]] = {}
    for name in args.cases:
        started = time.perf_counter()
        case = CASES[name]
        case_rows, profiles[name] = compare(case, pairs, args.ranks, args.steps, args.repeats,
                                            args.quiet_wait)
        rows += case_rows
        print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
    print(table(rows))
    write_results(args.json_out, args, rows, profiles)
    return rows


if __name__ == "__main__":
    main()
