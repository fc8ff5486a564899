"""Benchmark: bf16-mixed and bf16 against full float32 on gpt-tiny (issue 17, item 5).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/precision.py
        [--steps 50] [--quick] [--json-out benchmarks/results/precision.json]

gpt-tiny as ``pipeweave train`` builds it (4 layers as 10 sub-layer blocks, d_model 64, seq 64),
2 ranks, 1f1b, batch 8 in 4 micro-batches, Adam lr 1e-3, the single-process executor (the
numbers are the distributed run's, bit for bit). For each precision: the loss per step,
the largest |loss - float32 loss| over the steps, and per rank the counted activation bytes
(peak held between forwards and backwards) and model state bytes (parameters + gradients +
optimizer state), the bytes sent between ranks and the wall time (CPU autocast to bfloat16
is slow where the CPU has no bfloat16 units: time it on the hardware you will train on).
``--quick``: 5 steps, to check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan,
                               iteration_losses, run_local)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "precision.json"
PRECISIONS = ("full", "bf16-mixed", "bf16")
M = 4


def job(precision: str, steps: int) -> Job:
    return Job(plan=Plan.uniform(10, 2, schedule="1f1b", microbatches=M), steps=steps,
               model=BuiltinModel("gpt-tiny"),
               data=BuiltinData("stdlib-bytes", batch_size=8, seq_len=64),
               optimizer=OptimizerFactory("adam", {"lr": 1e-3}), precision=precision,
               count_activations=True)


def measure(precision: str, steps: int) -> dict[str, Any]:
    began = time.perf_counter()
    results = run_local(job(precision, steps))
    wall = time.perf_counter() - began
    return {"losses": iteration_losses(results, M),
            "activation_bytes": [r.peak_activation_bytes for r in results],
            "state_bytes": [r.state_bytes for r in results],
            "bytes_sent": [r.bytes_sent for r in results], "wall_s": wall}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 steps: check that it runs")
    parser.add_argument("--json-out", type=Path, default=None,
                        help=f"write the results as JSON (e.g. {DEFAULT_OUT})")
    args = parser.parse_args()
    steps = 5 if args.quick else args.steps
    runs = {p: measure(p, steps) for p in PRECISIONS}
    reference = runs["full"]["losses"]
    print(f"gpt-tiny, 2 ranks, 1f1b, batch 8 (4 micro-batches), {steps} steps")
    print(f"{'precision':>11} {'final loss':>10} {'max |dloss|':>11} {'activations KiB':>17} "
          f"{'state KiB':>15} {'sent KiB':>9} {'wall s':>7}")
    for precision, run in runs.items():
        run["max_loss_difference"] = max(abs(a - b) for a, b in zip(run["losses"], reference))
        kib = lambda values: "/".join(f"{v / 1024:.0f}" for v in values)  # noqa: E731
        print(f"{precision:>11} {run['losses'][-1]:>10.4f} {run['max_loss_difference']:>11.4f} "
              f"{kib(run['activation_bytes']):>17} {kib(run['state_bytes']):>15} "
              f"{sum(run['bytes_sent']) / 1024:>9.0f} {run['wall_s']:>7.1f}")
    print("(per rank: rank 0 / rank 1)")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"steps": steps, "runs": runs}, indent=1) + "\n")
        print(f"wrote {args.json_out}")
    return runs


if __name__ == "__main__":
    main()
