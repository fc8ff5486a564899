"""Benchmark: Algorithm 1 (advance forward propagation) driven by the simulator.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_advance.py
        [--json-out benchmarks/results/avgpipe_advance.json]

For each case the :class:`~pipeweave.avgpipe.AdvanceController` starts at 1F1B (advance 0)
and is fed, iteration after iteration, the simulated iteration time and peak activations
(one unit = one micro-batch's activations, ``Costs.activation_bytes = 1``) of ``avgpipe``
with the advance it chose. Costs F = 1, B = 2; "delay" is the transfer time of every message
between ranks (``Costs.comm``). Memory limit: none, or halfway between 1F1B's and AFAB's peak.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeweave.avgpipe import AdvanceController, run_controller
from pipeweave.avgpipe.simulated import advance_probe
from pipeweave.sim import Costs

# -- settings ----------------------------------------------------------------------------------
CASES = [(2, 8), (4, 8), (4, 16)]       # (ranks, micro-batches)
DELAYS = [0.0, 0.5, 1.0]                # message time relative to a forward (F = 1)
OUT = Path("benchmarks/results/avgpipe_advance.json")


def run_case(stages: int, microbatches: int, delay: float, limit: float | None) -> dict[str, Any]:
    probe = advance_probe(stages, microbatches, Costs.uniform(1.0, 2.0, delay))
    controller = AdvanceController(limit if limit is not None else 1e18, microbatches - 1)
    history = run_controller(controller, probe, 4 * microbatches)
    chosen, one_f_one_b, afab = probe(controller.advance), probe(0), probe(microbatches - 1)
    return {
        "ranks": stages, "microbatches": microbatches, "delay": delay, "limit": limit,
        "trajectory": [{"advance": s.advance, "iteration_time": s.iteration_time,
                        "peak_activations": max(probe(s.advance)[1]), "decision": s.decision,
                        "reason": s.reason} for s in history],
        "advance": controller.advance, "iteration_time": chosen[0], "peak": max(chosen[1]),
        "1f1b": {"iteration_time": one_f_one_b[0], "peak": max(one_f_one_b[1])},
        "afab": {"iteration_time": afab[0], "peak": max(afab[1])},
        "gap_closed": ((one_f_one_b[0] - chosen[0]) / (one_f_one_b[0] - afab[0])
                       if one_f_one_b[0] > afab[0] else None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results = []
    print(f"{'P':>2} {'M':>3} {'delay':>5} {'limit':>5}  trajectory (advance:time/peak)  ->  "
          f"chosen time/peak vs 1F1B, AFAB")
    for stages, microbatches in CASES:
        for delay in DELAYS:
            for limit in (None, (stages + microbatches) / 2):
                r = run_case(stages, microbatches, delay, limit)
                results.append(r)
                path = " ".join(f"{s['advance']}:{s['iteration_time']:g}/{s['peak_activations']:g}"
                                for s in r["trajectory"])
                print(f"{stages:>2} {microbatches:>3} {delay:>5g} {str(limit):>5}  {path}  ->  "
                      f"advance {r['advance']}: {r['iteration_time']:g}/{r['peak']:g} vs "
                      f"1F1B {r['1f1b']['iteration_time']:g}/{r['1f1b']['peak']:g}, AFAB "
                      f"{r['afab']['iteration_time']:g}/{r['afab']['peak']:g}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
