"""Benchmark: what a rank that waits (for a message, an all-reduce) costs the cores it shares
(issue 29, item 2: ranks > cores; ``pipeweave.sim.shared_cores``).

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/waiting_cpu.py \
        [--model cnn] [--ranks 4] [--steps 300] [--json-out benchmarks/results/waiting_cpu.json]

Trains, on ``--ranks`` local processes, the calibration's two shapes of the model
(:mod:`pipeweave.measure.calibration_runs`): ``pipeline``, 1F1B over ``ranks`` uniform stages
at M = 2 x ranks (most ranks wait most of the time), and ``data-parallel``, the whole model
on every rank at the same M (every rank computes at once). While each runs, every thread of
every rank process is sampled from ``/proc`` (utime + stime) every 50 ms; the CPU used in the
middle half of the run, per thread kind, is set against the seconds the ranks' timelines spent
in F/B actions over the same stretch (:func:`pipeweave.measure.compute_per_iteration`, wall
time: it stretches where ranks share the cores). Per plan: iteration time, the timelines'
compute per iteration summed over ranks, the CPU per iteration summed over ranks (main
threads, other threads), and the cores busy on average (CPU / wall). A waiting rank that
sleeps costs nothing: the CPU is then the compute's; a waiting rank that burns shows CPU
beyond it. The machine's load average is printed beside each plan (others' jobs share it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeweave.measure import measure_plan  # noqa: E402
from pipeweave.planner.plan import Plan  # noqa: E402
from pipeweave.models.registry import build_model  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (the ranks sit under a fork server)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parent[int(name)] = int(fields[1])
            except OSError:
                continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, pp in parent.items() if pp == pid]
        out += children
        frontier += children
    return out


def _threads(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """``(pid, tid) -> (thread name, CPU seconds)`` of every thread of ``pid``."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


class Sampler:
    """Every thread's CPU under this process, every ``period`` seconds, with the time."""

    def __init__(self, period: float = 0.05) -> None:
        self.samples: list[tuple[float, dict[tuple[int, int], tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(period,), daemon=True)

    def _loop(self, period: float) -> None:
        me = os.getpid()
        while not self._stop.wait(period):
            now = time.monotonic()
            sample: dict[tuple[int, int], tuple[str, float]] = {}
            for pid in _descendants(me):
                sample.update(_threads(pid))
            self.samples.append((now, sample))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _rank_threads(samples: list[tuple[float, dict[tuple[int, int], tuple[str, float]]]],
                  ranks: int) -> tuple[float, dict[int, dict[str, float]]]:
    """The middle half of the stretch where ``ranks`` rank processes ran: its seconds, and
    per rank process the CPU seconds of its main thread and of its other threads."""
    def rank_pids(sample: dict[tuple[int, int], tuple[str, float]]) -> set[int]:
        counts: dict[int, int] = {}
        for pid, _tid in sample:
            counts[pid] = counts.get(pid, 0) + 1
        return {pid for pid, n in counts.items() if n > 2}  # the fork server has one thread
    busy = [(t, s) for t, s in samples if len(rank_pids(s)) >= ranks]
    t0, t1 = busy[0][0], busy[-1][0]
    lo = min(busy, key=lambda e: abs(e[0] - (t0 + (t1 - t0) / 4)))
    hi = min(busy, key=lambda e: abs(e[0] - (t0 + 3 * (t1 - t0) / 4)))
    out: dict[int, dict[str, float]] = {}
    for (pid, tid), (name, cpu) in hi[1].items():
        if pid not in rank_pids(hi[1]):
            continue
        before = lo[1].get((pid, tid), (name, 0.0))[1]
        kind = "main" if pid == tid else name
        row = out.setdefault(pid, {})
        row[kind] = row.get(kind, 0.0) + cpu - before
    return hi[0] - lo[0], out


def measure(model: str, ranks: int, steps: int, depth: int, batch: int) -> dict[str, Any]:
    """One plan (``depth`` stages, the rest data-parallel copies) timed and sampled."""
    microbatches = 2 * ranks
    blocks = len(build_model(model, meta=True).blocks)
    plan = Plan.uniform(blocks, depth, schedule="1f1b", microbatches=microbatches,
                        width=ranks // depth)
    load = os.getloadavg()
    with Sampler() as sampler:
        done = measure_plan(plan, model=model, batch_size=batch, steps=steps, memory=False)
    seconds, threads = _rank_threads(sampler.samples, ranks)
    iterations = seconds / done.iteration_time
    main = sum(row.get("main", 0.0) for row in threads.values()) / iterations
    other = sum(v for row in threads.values() for k, v in row.items() if k != "main") / iterations
    kinds: dict[str, float] = {}
    for row in threads.values():
        for k, v in row.items():
            kinds[k] = kinds.get(k, 0.0) + v / iterations
    return {"plan": f"{depth} stages x {ranks // depth} copies, M={microbatches}",
            "iteration_time": done.iteration_time,
            "compute_per_iteration": sum(done.compute_seconds),
            "compute_per_rank": list(done.compute_seconds),
            "cpu_main_per_iteration": main, "cpu_other_per_iteration": other,
            "cpu_by_thread_name": kinds,
            "cores_busy": (main + other) / done.iteration_time,
            "window_s": seconds, "load_before": list(load), "load_after": list(os.getloadavg())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="samples per iteration (default 4 x 2 x ranks, as auto's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    batch = args.batch_size or 8 * args.ranks
    rows = []
    for _ in range(args.repeats):
        for depth in (args.ranks, 1):
            rows.append(measure(args.model, args.ranks, args.steps, depth, batch))
            r = rows[-1]
            print(f"{r['plan']:<28} iter {1e3 * r['iteration_time']:6.2f} ms  compute "
                  f"{1e3 * r['compute_per_iteration']:6.2f} ms  cpu main "
                  f"{1e3 * r['cpu_main_per_iteration']:6.2f} other "
                  f"{1e3 * r['cpu_other_per_iteration']:6.2f} ms  cores {r['cores_busy']:.2f}  "
                  f"load {r['load_before'][0]:.1f}", flush=True)
            print("   by thread:", {k: round(1e3 * v, 2) for k, v in
                                    sorted(r["cpu_by_thread_name"].items())}, flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "command": " ".join(sys.argv), "rows": rows,
             "median_cores": statistics.median(r["cores_busy"] for r in rows)}, indent=1))


if __name__ == "__main__":
    main()
