"""Benchmark: Algorithm 1 (advance forward propagation) driven by the simulator.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_advance.py
        [--json-out benchmarks/results/avgpipe_advance.json]

For each case the :class:`~pipeweave.avgpipe.AdvanceController` starts at 1F1B (advance 0)
and is fed, iteration after iteration, the simulated iteration time and peak activations
(one unit = one micro-batch's activations, ``Costs.activation_bytes = 1``) of ``avgpipe``
with the advance it chose. Costs F = 1, B = 2; "delay" is the transfer time of every message
between ranks (``Costs.comm``). Memory limit: none, or halfway between 1F1B's and AFAB's peak.

``--real``: the same algorithm in the runtime (``runtime/advance/online.py``) on 2 real ranks
(gloo, local processes) training ``avgpipe`` with N parallel pipelines, with every message
between the ranks held back ``delay`` seconds (``PIPEWEAVE_INJECT_DELAY=send=<delay>``, a
link latency: the sender does not wait). Per delay, three runs: advance 0 (1F1B) and
``all`` (AFAB), measured one iteration at a time exactly as the controller measures, and
``auto`` (the controller, from 1F1B). Printed: the advance, measured iteration time and peak
activation bytes per iteration of the auto run; then, for each run, the median iteration time
at the advance it ends with (iterations run one at a time, after ``warmup``) and its peak
activations, and the auto run's median once settled (those iterations run as one schedule,
without synchronising between iterations, so a little faster). Each delay runs in its own interpreter (the delay is read from the
environment when the ranks start)::

    PYTHONPATH=src .venv/bin/python benchmarks/avgpipe_advance.py --real
        [--delays 0,0.03] [--json-out benchmarks/results/avgpipe_advance_real.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeweave.avgpipe import AdvanceController, run_controller
from pipeweave.avgpipe.simulated import advance_probe
from pipeweave.sim import Costs

# -- settings ----------------------------------------------------------------------------------
CASES = [(2, 8), (4, 8), (4, 16)]       # (ranks, micro-batches)
DELAYS = [0.0, 0.5, 1.0]                # message time relative to a forward (F = 1)
OUT = Path("benchmarks/results/avgpipe_advance.json")
REAL = {"model": "gpt-tiny", "stages": 2, "pipelines": 2, "microbatches": 8, "batch_size": 16,
        "seq_len": 64, "steps": 36, "reference_steps": 12, "warmup": 3, "samples": 3,
        "tolerance": 0.03}
REAL_DELAYS = [0.0, 0.03]              # seconds every message between the ranks is held back
REAL_OUT = Path("benchmarks/results/avgpipe_advance_real.json")


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


def real_case(delay: float) -> dict[str, Any]:
    """One delay: 1F1B, AFAB and the controller on 2 real ranks (run in a fresh interpreter
    whose environment carries the delay)."""
    from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan,
                                   launch_local)
    from pipeweave.runtime.advance.options import AdvanceOptions
    from pipeweave.runtime.observation.summary import summarize

    model = BuiltinModel(REAL["model"], overrides={"seq_len": REAL["seq_len"]})
    plan = Plan.uniform(len(model().blocks), REAL["stages"], schedule="avgpipe",
                        microbatches=REAL["microbatches"], pipelines=REAL["pipelines"])
    data = BuiltinData("stdlib-bytes", batch_size=REAL["batch_size"], seq_len=REAL["seq_len"])
    out: dict[str, Any] = {"delay": delay}
    for name, fixed in (("1f1b", 0), ("afab", "all"), ("auto", None)):
        steps = REAL["steps"] if fixed is None else REAL["reference_steps"]
        options = AdvanceOptions(samples=REAL["samples"], tolerance=REAL["tolerance"],
                                 warmup=REAL["warmup"], fixed=fixed)
        job = Job(plan=plan, steps=steps, model=model, data=data,
                  optimizer=OptimizerFactory("adam", {"lr": 1e-3}), advance=options,
                  timeout_s=120)
        results = launch_local(job, deadline_s=600)
        summary = summarize(results, schedule="avgpipe", steps=steps,
                            batch_size=REAL["batch_size"], microbatches=REAL["microbatches"],
                            pipelines=REAL["pipelines"])
        log = results[0].advance_log
        ends = summary.iteration_end_s
        per_step = [b - a for a, b in zip(ends, ends[1:])]
        chosen = results[0].advance_per_step[-1]
        # Same footing for all three runs: iterations run one at a time after the warm-up,
        # at the advance the run ends with (every iteration for 1F1B and AFAB).
        steady = [e for e in log if e["step"] > REAL["warmup"] and e["advance"] == chosen]
        steady = steady or [e for e in log if e["advance"] == chosen]
        # The auto run's iterations after it settled ran as one schedule (no synchronisation
        # between them); per_step[i] is step i + 2, so this skips the first of them.
        tail = per_step[len(log):] if fixed is None else []
        out[name] = {
            "advance_per_step": results[0].advance_per_step,
            "trajectory": [{k: e[k] for k in ("step", "advance", "measured_s", "activation_bytes",
                                              "peak_bytes", "decision", "reason")} for e in log],
            "iteration_s": statistics.median(e["measured_s"] for e in steady),
            "steady_iterations": len(steady),
            "tail_iteration_s": statistics.median(tail) if tail else None,
            "tail_steps": len(tail),
            "peak_activation_bytes": max(e["activation_bytes"] for e in steady),
            "chosen": chosen,
        }
    return out


def run_real(delays: list[float], json_out: Path) -> int:
    results = []
    print(f"2 real ranks, avgpipe N={REAL['pipelines']} M={REAL['microbatches']} "
          f"{REAL['model']} (seq {REAL['seq_len']}, batch {REAL['batch_size']}); per iteration "
          f"of the auto run: advance:measured ms/peak activation KiB")
    for delay in delays:
        env = {**os.environ, "PIPEWEAVE_INJECT_DELAY": f"send={delay}"}
        done = subprocess.run([sys.executable, __file__, "--real-case", str(delay), "--steps",
                               str(REAL["steps"])], env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return done.returncode
        r = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(r)
        auto = r["auto"]
        path = " ".join(f"{e['advance']}:{e['measured_s'] * 1e3:.0f}/"
                        f"{e['activation_bytes'] / 1024:.0f}" for e in auto["trajectory"])
        print(f"delay {delay * 1e3:g} ms: {path}")
        tail = auto["tail_iteration_s"]
        print(f"  -> ends at advance {auto['chosen']}: {auto['iteration_s'] * 1e3:.0f} ms/iteration"
              f"{f' ({tail * 1e3:.0f} ms once settled, as one schedule)' if tail else ''}, "
              f"peak activations {auto['peak_activation_bytes'] / 1024:.0f} KiB | 1F1B "
              f"{r['1f1b']['iteration_s'] * 1e3:.0f} ms, {r['1f1b']['peak_activation_bytes'] / 1024:.0f} KiB"
              f" | AFAB {r['afab']['iteration_s'] * 1e3:.0f} ms, "
              f"{r['afab']['peak_activation_bytes'] / 1024:.0f} KiB")
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"settings": REAL, "cases": results}, indent=2) + "\n")
    print(f"wrote {json_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--real", action="store_true", help="2 real ranks with injected delay")
    parser.add_argument("--delays", default=",".join(str(d) for d in REAL_DELAYS),
                        help="--real: seconds each message is held back, comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="--real: steps of the auto run")
    parser.add_argument("--real-case", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is not None:
        REAL["steps"] = args.steps
    if args.real_case is not None:
        print(json.dumps(real_case(args.real_case)))
        return 0
    if args.real:
        delays = [float(d) for d in args.delays.split(",")]
        return run_real(delays, args.json_out or REAL_OUT)
    args.json_out = args.json_out or OUT
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
