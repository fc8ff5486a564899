"""Benchmark: asynchronous weight semantics vs synchronous 1F1B vs torch's Schedule1F1B.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/async_throughput.py
        [--repeats 3] [--steps 8] [--ranks 2] [--cases gpt256 gpt-small]
        [--methods 1f1b pipedream 2bw wpipe pipeoptim pipeoptim-graph one-process]
        [--json-out benchmarks/results/async_throughput.json]

Every method trains the SAME model on the SAME data with the same batch size, micro-batch
count M, plain SGD (torch's fused implementation, pipeweave's default) and one process per
rank (gloo, one intra-op thread), set up as in ``vs_torch_pipelining.py`` (whose measurement
helpers this script reuses). The reference is ``torch.distributed.pipelining``'s
``Schedule1F1B`` on the same block ranges (with ``torch.optim.SGD`` as a user writes it).

* Every stage holds the same number of transformer blocks; the embedding joins the first
  stage and the head the last (:func:`balanced_stages`). ``wpipe`` runs two chunks per rank
  (its 2GW groups), so its stages are half as deep.
* ``1f1b``, ``2bw``, ``wpipe`` update once per batch of M micro-batches; ``pipedream`` and
  ``pipeoptim`` once per micro-batch. The asynchronous ones never flush, so after the warm-up
  every rank alternates forward and backward without idling; ``1f1b`` and torch's flush every
  batch, which at P ranks costs (P - 1)/(M + P - 1) of the time: with P = 2, M = 8 the most
  an asynchronous schedule can gain is 9/8 = 1.125x.
* ``pipeoptim`` recomputes each stage's forward at backward time (the paper's backward at
  the current weights); ``pipeoptim-graph`` differentiates the predicted-weights graph.
* ``one-process`` is what a user of this machine would run instead: the whole model in one
  process with as many intra-op threads as the ranks have cores, whole batches, same SGD.

Per run: throughput (batch size over the median iteration time of iterations 2..K);
pipeline efficiency (busy forward/backward time over ranks x wall time, iterations 2..K);
forward, backward and update time per micro-batch, summed over the stages from the measured
timeline of iterations 2..K (so WPipe's half-size stages compare with everyone else's), and
the time PipeOptim spends writing predicted weights (inside its forwards; whole run);
replicas built and bytes copied into them per update (stashed weight versions,
``runtime/execution/replicas.py``); the weight versions each stage held against the simulator's count;
peak RSS per rank. Runs alternate between methods within a repeat; each number is the median
over ``--repeats``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from vs_torch_pipelining import (  # noqa: E402
    CASES as TORCH_CASES, QUIET_WAIT_S, Case, case_job, num_blocks, run_torch, steady_throughput,
    write_results,
)

import torch  # noqa: E402

from pipeweave.ir import Op, parse_action  # noqa: E402
from pipeweave.runtime import Plan, launch_local  # noqa: E402
from pipeweave.runtime.job import BuiltinData, BuiltinModel, OptimizerFactory  # noqa: E402
from pipeweave.runtime.observation.summary import summarize  # noqa: E402
from pipeweave.runtime.execution.parts import make_schedule  # noqa: E402
from pipeweave.sim import simulate  # noqa: E402

# -- settings -------------------------------------------------------------------------------
STEPS = 8
REPEATS = 3
RANKS = (2,)
METHODS = ("1f1b", "pipedream", "2bw", "wpipe", "pipeoptim", "pipeoptim-graph", "one-process")
SEMANTICS = {"pipeoptim-graph": ("pipeoptim", {"backward": "graph"})}
"""Variants: PipeOptim's backward by default recomputes the stage's forward at the current
weights (the paper's rule); ``backward="graph"`` differentiates the forward's own graph
(built at the predicted weights), saving that recomputation (docs/semantics.md)."""
ONE_PROCESS = "one-process"
TORCH = "torch-1f1b"
CASES = {
    **TORCH_CASES,
    # The issue's model: GPT-like, d 256, 8 transformer blocks (one block each), T 64.
    "gpt256": Case("gpt d256 L8 T64", "gpt-tiny",
                   {"d_model": 256, "n_layers": 8, "n_heads": 4, "d_ff": 1024, "seq_len": 64,
                    "sublayer": False},
                   dataset="stdlib-bytes", seq_len=64, batch_size=64, microbatches=8, lr=0.01),
    # The gpt-small preset (d 128, 8 layers as attention and MLP halves, T 128).
    "gpt-small": Case("gpt-small T128", "gpt-small", {}, dataset="stdlib-bytes", seq_len=128,
                      batch_size=64, microbatches=8, lr=0.01),
}
DEFAULT_CASES = ("gpt256", "gpt-small")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "async_throughput.json"


def balanced_stages(blocks: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Equal shares of the inner blocks; block 0 (embedding) joins the first stage and the
    last block (head) the last, e.g. 10 blocks on 4 stages: [0,3) [3,5) [5,7) [7,10)."""
    inner = blocks - 2
    if inner < stages:
        raise ValueError(f"{blocks} blocks cannot give {stages} stages a transformer block each")
    bounds = [1 + (inner * s) // stages for s in range(stages + 1)]
    bounds[0], bounds[-1] = 0, blocks
    return tuple(zip(bounds, bounds[1:]))


def plan_for(case: Case, method: str, ranks: int) -> Plan:
    chunks = 2 if method == "wpipe" else 1
    schedule, semantics = SEMANTICS.get(method, (method, {}))
    return Plan(num_blocks(case), balanced_stages(num_blocks(case), ranks * chunks),
                schedule=schedule, microbatches=case.microbatches, chunks=chunks,
                semantics=semantics)


def per_microbatch_ms(results: list[Any], start: float, microbatches: int) -> dict[str, float]:
    """F, B and U time per micro-batch, summed over stages, for actions after ``start``."""
    totals = {"F": 0.0, "B": 0.0, "U": 0.0}
    for result in results:
        for _, text, began, ended in result.records:
            op = parse_action(text).op
            if began >= start and op in (Op.FORWARD, Op.BACKWARD, Op.STEP):
                totals[op.value] += ended - began
    return {f"{op}_ms": 1000 * total / microbatches for op, total in totals.items()}


def run_method(case: Case, method: str, ranks: int, steps: int) -> dict[str, Any]:
    """One pipeweave run: throughput, efficiency, time per micro-batch, versions, memory."""
    plan = plan_for(case, method, ranks)
    job = case_job(case, plan, steps)
    results = launch_local(job)
    summary = summarize(results, schedule=method, steps=steps, batch_size=case.batch_size,
                        microbatches=case.microbatches)
    ends = summary.iteration_end_s
    timed_microbatches = (steps - 1) * case.microbatches
    updates = sum(n for r in results for n in r.updates.values())
    copied = sum(n for r in results for n in r.weight_bytes_copied.values())
    held = {s: v for r in results for s, v in r.peak_weight_versions.items()}
    return {"samples_per_second": steady_throughput(ends, case.batch_size),
            "efficiency": summary.pipeline_efficiency,
            **per_microbatch_ms(results, ends[0], timed_microbatches),
            "updates": updates,
            "predict_ms": 1000 * sum(t for r in results for t in r.prediction_seconds.values())
            / (steps * case.microbatches),
            "replicas_built": sum(n for r in results for n in r.weight_replicas.values()),
            "peak_weight_copies": sum(n for r in results for n in r.peak_weight_copies.values()),
            "bytes_copied_per_update": copied / updates if updates else 0.0,
            "weight_versions": [held[s] for s in sorted(held)],
            "simulated_weight_versions": simulate(
                make_schedule(plan, steps),
                keep_predicted=plan.semantics.backward == "graph").weight_versions,
            "peak_memory_bytes": float(max(summary.peak_memory_bytes)),
            "final_loss": summary.final_loss, "first_loss": summary.losses[0]}


def run_reference(case: Case, ranks: int, steps: int) -> dict[str, Any]:
    run = run_torch(case, "1f1b", ranks, steps, stages=balanced_stages(num_blocks(case), ranks))
    return {"samples_per_second": run.samples_per_second,
            "peak_memory_bytes": float(max(run.peak_rss_bytes)),
            "final_loss": run.losses[-1], "first_loss": run.losses[0]}


def _one_process_worker(case: Case, threads: int, steps: int, out: Any) -> None:
    """The whole model in this process: whole batches, ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    spec = BuiltinModel(case.model, overrides=case.overrides)().materialized()
    model = torch.nn.Sequential(*spec.blocks)
    optimizer = OptimizerFactory("sgd", {"lr": case.lr})(model.parameters())
    batches = iter(BuiltinData(case.dataset, batch_size=case.batch_size, seq_len=case.seq_len)())
    ends, losses = [], []
    for _ in range(steps):
        inputs, targets = next(batches)
        loss = spec.loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
        losses.append(float(loss.detach()))
    from pipeweave.runtime.observation.results import peak_rss_bytes

    out.put({"ends": ends, "losses": losses, "peak": peak_rss_bytes()})


def run_one_process(case: Case, ranks: int, steps: int) -> dict[str, Any]:
    """What this machine does without pipelining: one process, ``ranks`` threads."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_one_process_worker, args=(case, ranks, steps, queue))
    process.start()
    result = queue.get(timeout=600)
    process.join(timeout=60)
    return {"samples_per_second": steady_throughput(result["ends"], case.batch_size),
            "peak_memory_bytes": float(result["peak"]),
            "final_loss": result["losses"][-1], "first_loss": result["losses"][0]}


def run_any(case: Case, method: str, ranks: int, steps: int) -> dict[str, Any]:
    if method == TORCH:
        return run_reference(case, ranks, steps)
    if method == ONE_PROCESS:
        return run_one_process(case, ranks, steps)
    return run_method(case, method, ranks, steps)


def compare(case: Case, methods: list[str], ranks: int, steps: int, repeats: int,
            quiet_wait_s: float) -> dict[str, Any]:
    """``repeats`` rounds over torch's 1F1B and every method; medians per method."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in [TORCH, *methods]}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
        for method in order:
            if quiet_wait_s > 0:
                wait_for_quiet(quiet_wait_s)
            with ForeignLoad() as load:
                run = run_any(case, method, ranks, steps)
            run["foreign_load"] = load.share
            runs[method].append(run)
    reference = statistics.median(r["samples_per_second"] for r in runs[TORCH])
    own = (statistics.median(r["samples_per_second"] for r in runs["1f1b"])
           if "1f1b" in runs else float("nan"))
    row: dict[str, Any] = {"case": case.label, "ranks": ranks, "methods": {}}
    for method, method_runs in runs.items():
        throughput = statistics.median(r["samples_per_second"] for r in method_runs)
        summary: dict[str, Any] = {
            "samples_per_second": throughput,
            "vs_torch_1f1b": throughput / reference,
            "vs_1f1b": throughput / own,
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in method_runs),
            "first_loss": method_runs[0]["first_loss"],
            "final_loss": method_runs[0]["final_loss"],
        }
        for key in ("efficiency", "F_ms", "B_ms", "U_ms", "predict_ms", "bytes_copied_per_update"):
            if key in method_runs[0]:
                summary[key] = statistics.median(r[key] for r in method_runs)
        for key in ("replicas_built", "peak_weight_copies", "weight_versions",
                    "simulated_weight_versions"):
            if key in method_runs[0]:
                summary[key] = method_runs[0][key]
        summary["runs"] = method_runs
        row["methods"][method] = summary
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<16} {'method':<15} | {'samples/s':>9} {'vs torch':>8} {'vs 1f1b':>7} "
            f"{'eff':>5} | {'F ms':>6} {'B ms':>6} {'U ms':>5} {'pred':>5} {'MB/upd':>6} | "
            f"{'versions':>9} {'sim':>9} | {'RSS MiB':>7} | {'loss 1':>6} {'loss K':>6}")
    lines = [head, " " * 69 + "per micro-batch, all stages", "-" * len(head)]
    for row in rows:
        for method, m in row["methods"].items():
            def num(key: str, fmt: str) -> str:
                value = m.get(key)
                return "—" if value is None or value != value else format(value, fmt)
            versions = " ".join(map(str, m.get("weight_versions", []))) or "—"
            simulated = " ".join(map(str, m.get("simulated_weight_versions", []))) or "—"
            copied = m.get("bytes_copied_per_update")
            lines.append(
                f"{row['case']:<16} {method:<15} | {m['samples_per_second']:>9.1f} "
                f"{m['vs_torch_1f1b']:>7.2f}x {m['vs_1f1b']:>6.2f}x {num('efficiency', '.2f'):>5} | "
                f"{num('F_ms', '.1f'):>6} {num('B_ms', '.1f'):>6} {num('U_ms', '.2f'):>5} "
                f"{num('predict_ms', '.2f'):>5} "
                f"{'—' if copied is None else format(copied / 2**20, '.1f'):>6} | "
                f"{versions:>9} {simulated:>9} | {m['peak_memory_bytes'] / 2**20:>7.0f} | "
                f"{m['first_loss']:>6.3f} {m['final_loss']:>6.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S)
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: need >= 3 (one warm-up plus two timed iterations)")
    rows = []
    for name in args.cases:
        for ranks in args.ranks:
            started = time.perf_counter()
            rows.append(compare(CASES[name], args.methods, ranks, args.steps, args.repeats,
                                args.quiet_wait))
            print(f"  {name} {ranks} ranks done ({time.perf_counter() - started:.0f} s)", flush=True)
    print(table(rows))
    write_results(args.json_out, args, rows, cases=CASES)
    return rows


if __name__ == "__main__":
    main()
