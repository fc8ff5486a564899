"""Benchmark: asynchronous weight semantics vs synchronous 1F1B vs torch's Schedule1F1B.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/async_throughput.py
        [--repeats 3] [--steps 12] [--ranks 2 4] [--cases gpt]
        [--methods 1f1b pipedream pipeoptim 2bw wpipe]
        [--json-out benchmarks/results/async_throughput.json]

Every method trains the SAME model on the SAME data with the same batch size, micro-batch
size and count M, plain SGD and one process per rank (gloo, one intra-op thread), set up as in
``vs_torch_pipelining.py`` (whose measurement helpers this script reuses). The reference is
``torch.distributed.pipelining``'s ``Schedule1F1B`` on the same block ranges.

* ``1f1b``, ``2bw``, ``wpipe`` update once per batch of M micro-batches; ``pipedream`` and
  ``pipeoptim`` once per micro-batch. The asynchronous ones never flush, so after the warm-up
  every rank alternates forward and backward without idling (the simulator's steady-state
  bubble is zero); ``1f1b`` and torch's flush every batch.
* ``pipeoptim`` recomputes each stage's forward at backward time (the paper's backward at
  the current weights), ``pipeoptim-graph`` differentiates the predicted-weights graph.
* ``wpipe`` runs two chunks per rank (its 2GW groups), so its stages are half as deep;
  every other method uses ``depth`` stages of equal block counts.

Throughput: batch size over the median iteration time of iterations 2..K (iteration = M
micro-batches; see ``steady_throughput``). Pipeline efficiency (pipeweave only): busy
forward/backward time over ranks x wall time, from the end of the first iteration to the
end of the last (``pipeweave.runtime.summary``). Runs alternate between methods within a
repeat; each number is the median over ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_load import ForeignLoad, wait_for_quiet  # noqa: E402
from vs_torch_pipelining import (  # noqa: E402
    CASES, QUIET_WAIT_S, Case, case_job, num_blocks, run_torch, steady_throughput, write_results,
)

from pipeweave.runtime import Plan, launch_local  # noqa: E402
from pipeweave.runtime.summary import summarize  # noqa: E402

# -- settings -------------------------------------------------------------------------------
STEPS = 12
REPEATS = 3
RANKS = (2, 4)
METHODS = ("1f1b", "pipedream", "pipeoptim", "pipeoptim-graph", "2bw", "wpipe")
SEMANTICS = {"pipeoptim-graph": ("pipeoptim", {"backward": "graph"})}
"""Variants: PipeOptim's backward by default recomputes the stage's forward at the current
weights (the paper's rule); ``backward="graph"`` differentiates the forward's own graph
(built at the predicted weights), saving that recomputation (docs/semantics.md)."""
DEFAULT_CASES = ("gpt",)
TORCH = "torch-1f1b"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "async_throughput.json"


def run_method(case: Case, method: str, ranks: int, steps: int) -> dict[str, float]:
    """One pipeweave run: steady samples/s, measured efficiency, max peak memory."""
    chunks = 2 if method == "wpipe" else 1
    schedule, semantics = SEMANTICS.get(method, (method, {}))
    plan = Plan.uniform(num_blocks(case), ranks, chunks=chunks, schedule=schedule,
                        microbatches=case.microbatches, semantics=semantics)
    results = launch_local(case_job(case, plan, steps))
    summary = summarize(results, schedule=method, steps=steps, batch_size=case.batch_size,
                        microbatches=case.microbatches)
    return {"samples_per_second": steady_throughput(summary.iteration_end_s, case.batch_size),
            "efficiency": summary.pipeline_efficiency,
            "peak_memory_bytes": float(max(summary.peak_memory_bytes)),
            "final_loss": summary.final_loss, "first_loss": summary.losses[0]}


def run_reference(case: Case, ranks: int, steps: int) -> dict[str, float]:
    run = run_torch(case, "1f1b", ranks, steps)
    return {"samples_per_second": run.samples_per_second, "efficiency": float("nan"),
            "peak_memory_bytes": float(max(run.peak_rss_bytes)),
            "final_loss": run.losses[-1], "first_loss": run.losses[0]}


def compare(case: Case, methods: list[str], ranks: int, steps: int, repeats: int,
            quiet_wait_s: float) -> dict[str, Any]:
    """``repeats`` rounds over torch's 1F1B and every method; medians per method."""
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in [TORCH, *methods]}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
        for method in order:
            if quiet_wait_s > 0:
                wait_for_quiet(quiet_wait_s)
            with ForeignLoad() as load:
                run = (run_reference(case, ranks, steps) if method == TORCH
                       else run_method(case, method, ranks, steps))
            run["foreign_load"] = load.share
            runs[method].append(run)
    reference = statistics.median(r["samples_per_second"] for r in runs[TORCH])
    row: dict[str, Any] = {"case": case.label, "ranks": ranks, "methods": {}}
    for method, method_runs in runs.items():
        throughput = statistics.median(r["samples_per_second"] for r in method_runs)
        row["methods"][method] = {
            "samples_per_second": throughput,
            "vs_torch_1f1b": throughput / reference,
            "efficiency": statistics.median(r["efficiency"] for r in method_runs),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in method_runs),
            "first_loss": method_runs[0]["first_loss"],
            "final_loss": method_runs[0]["final_loss"],
            "runs": method_runs,
        }
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<16} {'ranks':>5} {'method':<15} | {'samples/s':>9} {'vs torch':>8} "
            f"{'efficiency':>10} | {'loss 1':>7} {'loss K':>7}")
    lines = [head, "-" * len(head)]
    for row in rows:
        for method, m in row["methods"].items():
            eff = "—" if m["efficiency"] != m["efficiency"] else f"{m['efficiency']:.2f}"
            lines.append(f"{row['case']:<16} {row['ranks']:>5} {method:<15} | "
                         f"{m['samples_per_second']:>9.1f} {m['vs_torch_1f1b']:>7.2f}x "
                         f"{eff:>10} | {m['first_loss']:>7.3f} {m['final_loss']:>7.3f}")
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
    write_results(args.json_out, args, rows)
    return rows


if __name__ == "__main__":
    main()
