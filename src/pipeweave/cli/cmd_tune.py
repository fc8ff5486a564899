"""``pipeweave tune``: choose AvgPipe's micro-batch count M and pipeline count N (avgpipe.txt §5.2).

    pipeweave tune --model gpt-tiny --stages 2 --microbatches-grid 2,4,8 --pipelines-grid 1,2,3
    pipeweave tune --model cnn --stages 4 --memory-limit 0.5MB --mode traverse --json

Profiles ONE setting (``--profile-at``, default: the paper's choice, the largest M and the
smallest N of the grid), predicts every (M, N) of the grid with Equations 1-8, prints the table (predicted
time per batch and per iteration, predicted peak memory per rank, whether it fits
``--memory-limit``) and the chosen (M, N). ``--mode traverse`` also evaluates every setting
and prints the tuner's pick against the traversal's best and how long each took.

``--source simulate`` (default): a setting is simulated with per-block costs that the profiler
measures on this machine at that setting's micro-batch size (``--batch-size / M`` samples).
``--source measure``: the profiled setting (and, in traverse mode, every setting) is a short
real run of ``avgpipe`` on ``--stages`` local processes: ``--warmup`` iterations, then
``--iterations`` timed ones (avgpipe.txt §5.1: ten), the time the median iteration and the
memory the runtime's counted peak per rank (model state + activations, runtime/observation/memory.py).
The utilisation ``φ`` is the busy share of each rank's timeline; ``--utilisation work``
(default) splits a rank's compute time into per-sample work (level 1) and per-call overhead
(level 0) from the profiler's times at the profiled and the largest micro-batch,
``intensity`` uses one calibrated level, ``busy`` level 1 (no profiler); see docs/avgpipe.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from ..avgpipe import Measurement, Prediction, traverse, tune
from ..avgpipe.tuner import MEMORY_RULES, MODES, settings
from ..measure import (LOOPBACK_BANDWIDTH, SOURCES, UTILISATIONS, RealRun, builtin_model,
                       profile_cache, run_setting, tuning_profile, tuning_sizes)
from ..models import available_models
from ..planner.evaluate import Network
from .options import parse_bytes

__all__ = ["add_parser", "run", "parse_grid", "default_profile_at"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune", help="AvgPipe: choose micro-batches M and parallel pipelines N under a memory limit",
        description=__doc__,
    )
    parser.add_argument("--model", required=True, choices=available_models())
    parser.add_argument("--stages", type=int, required=True, help="pipeline depth P (ranks)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per batch (per pipeline)")
    parser.add_argument("--microbatches-grid", default="1,2,4,8", metavar="M,M,...",
                        help="micro-batch counts to consider (divisors of --batch-size)")
    parser.add_argument("--pipelines-grid", default="1,2,3", metavar="N,N,...",
                        help="parallel pipeline counts to consider")
    parser.add_argument("--memory-limit", default=None, metavar="BYTES",
                        help="memory per rank, e.g. 8e6 or 8MB (default: no limit)")
    parser.add_argument("--mode", default="predict", choices=["predict", "traverse"],
                        help="predict from one profile, or also evaluate every setting")
    parser.add_argument("--source", default="simulate", choices=list(SOURCES),
                        help="simulate settings from measured costs, or run them for real")
    parser.add_argument("--profile-at", default="auto", metavar="M,N",
                        help="the setting to profile (default: largest M, smallest N)")
    parser.add_argument("--utilisation", default="work", choices=list(UTILISATIONS),
                        help="utilisation of a computing rank: work/overhead split, one "
                             "calibrated level, or 1 (plain busy share)")
    parser.add_argument("--sharing", default="interleaved", choices=list(MODES),
                        help="how N pipelines share a rank: pipeweave's interleaved programs, "
                             "or the paper's concurrent processes")
    parser.add_argument("--memory-rule", default="held", choices=list(MEMORY_RULES),
                        help="Equation 8 with the held-micro-batch correction, or as printed")
    parser.add_argument("--bandwidth", type=float, default=LOOPBACK_BANDWIDTH,
                        help="bytes/s between consecutive ranks (default: this machine's loopback)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per message")
    parser.add_argument("--warmup", type=int, default=1,
                        help="iterations run and left out per real run (--source measure)")
    parser.add_argument("--iterations", type=int, default=10,
                        help="timed iterations per real run (--source measure); the median counts")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where real runs train (--source measure); cuda: one GPU per "
                             "rank, or ranks sharing the GPUs where they outnumber them "
                             "(docs/gpu.md)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def parse_grid(flag: str, text: str) -> list[int]:
    """``"2,4,8"`` -> ``[2, 4, 8]``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be comma-separated integers, e.g. {flag} 2,4,8") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r} needs integers >= 1, e.g. {flag} 2,4,8")
    return sorted(set(values))


def default_profile_at(microbatches: list[int], pipelines: list[int]) -> tuple[int, int]:
    """§5.2.1: "a rather large M and a small N so that GPUs are not fully utilized" — the
    largest M and the smallest N of the grid."""
    return (max(microbatches), min(pipelines))


def _pair(text: str) -> tuple[int, int] | None:
    parts = text.split(",")
    try:
        m, n = (int(p) for p in parts)
    except ValueError:
        return None
    return (m, n) if m >= 1 and n >= 1 else None


def run(args: argparse.Namespace) -> int:
    ms = parse_grid("--microbatches-grid", args.microbatches_grid)
    ns = parse_grid("--pipelines-grid", args.pipelines_grid)
    settings(ms, ns, args.batch_size)  # validates the grid against the batch size
    profile_at = default_profile_at(ms, ns) if args.profile_at == "auto" else _pair(args.profile_at)
    if profile_at is None or args.batch_size % profile_at[0]:
        raise ValueError(f"--profile-at {args.profile_at!r} must be M,N (integers >= 1) with M "
                         f"dividing --batch-size {args.batch_size}, e.g. --profile-at 4,1")
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    if not args.bandwidth > 0 or not args.latency >= 0:
        raise ValueError(f"--bandwidth {args.bandwidth} must be > 0 bytes/s (inf: free) and "
                         f"--latency {args.latency} >= 0 seconds")
    if args.warmup < 1 or args.iterations < 1:
        raise ValueError(f"--warmup {args.warmup} and --iterations {args.iterations} must be >= 1 "
                         f"(a real run leaves its first iteration out), e.g. --warmup 1 "
                         f"--iterations 10")
    network = Network(bandwidth=args.bandwidth, latency=args.latency)
    sizes = tuning_sizes(at=profile_at, smallest_m=min(ms), batch_size=args.batch_size,
                         utilisation=args.utilisation)  # profiled together, interleaved
    sm = builtin_model(args.model, stages=args.stages, batch_size=args.batch_size,
                       network=network, sizes=sizes)

    started = time.perf_counter()
    profile = tuning_profile(sm, at=profile_at, smallest_m=min(ms), batch_size=args.batch_size,
                             source=args.source, utilisation=args.utilisation,
                             run=lambda m, n: _run(args, m, n))
    result = tune(profile, ms, ns, memory_limit=limit, mode=args.sharing, memory=args.memory_rule)
    tuning_s = time.perf_counter() - started
    report: dict[str, Any] = {
        "model": args.model, "stages": args.stages, "batch_size": args.batch_size,
        "source": args.source, "profile_at": list(profile_at), "memory_limit": limit,
        "tuning_s": tuning_s, "chosen": _setting(result.best),
        "predictions": [_row(p, limit) for p in result.predictions],
        "profile": profile.to_json(),
    }
    traversal = None
    if args.mode == "traverse":
        # every setting measured afresh, as a traversal of short runs would (no profile reuse)
        fresh = builtin_model(args.model, stages=args.stages, batch_size=args.batch_size,
                              network=network, profile_at=profile_cache(args.model, cache=False))
        measure = fresh.measure if args.source == "simulate" else _real(args)
        traversal = traverse(measure, ms, ns, memory_limit=limit, batch_size=args.batch_size)
        report["traversal"] = {
            "traversal_s": traversal.elapsed_s, "best": _setting(traversal.best),
            "measurements": [{"M": x.microbatches, "N": x.pipelines, "batch_s": x.batch_s,
                              "iteration_s": x.iteration_s, "memory_bytes": x.memory_bytes,
                              **{k: x.extra[k] for k in ("memory_per_rank", "wall_s")
                                 if k in x.extra}}
                             for x in traversal.measurements],
        }
        if result.best is not None and traversal.best is not None:
            picked = traversal.find(result.best.microbatches, result.best.pipelines)
            report["traversal"]["pick_vs_best"] = picked.batch_s / traversal.best.batch_s
    if args.json:
        print(json.dumps(report))
    else:
        print(_format(report, result.predictions, traversal))
    return 0


def _run(args: argparse.Namespace, m: int, n: int) -> RealRun:
    return run_setting(args.model, stages=args.stages, microbatches=m, pipelines=n,
                       batch_size=args.batch_size, warmup=args.warmup,
                       iterations=args.iterations, device=args.device)


def _real(args: argparse.Namespace) -> Callable[[int, int], Measurement]:
    def measure(m: int, n: int) -> Measurement:
        return _run(args, m, n).measurement()
    return measure


def _setting(p: Prediction | Measurement | None) -> list[int] | None:
    return None if p is None else [p.microbatches, p.pipelines]


def _row(p: Prediction, limit: float | None) -> dict[str, Any]:
    return {"M": p.microbatches, "N": p.pipelines, "batch_s": p.batch_s,
            "iteration_s": p.iteration_s, "memory_bytes": p.memory_bytes,
            "memory_per_rank": [r.memory_bytes for r in p.ranks],
            "feasible": limit is None or p.memory_bytes <= limit}


def _format(report: dict[str, Any], predictions: tuple[Prediction, ...], traversal: Any) -> str:
    limit = report["memory_limit"]
    m, n = report["profile_at"]
    lines = [f"{report['model']} on {report['stages']} ranks, batch {report['batch_size']}; "
             f"profiled M={m}, N={n} ({report['source']}); memory limit "
             f"{'none' if limit is None else f'{limit / 1e6:.3f} MB'}",
             f"{'M':>4} {'N':>3} {'pred ms/batch':>14} {'pred ms/iter':>13} {'pred MB':>9} "
             f"{'fits':>5}" + (f" {'meas ms/batch':>14} {'meas MB':>9}" if traversal else "")]
    for p in predictions:
        fits = limit is None or p.memory_bytes <= limit
        line = (f"{p.microbatches:>4} {p.pipelines:>3} {1e3 * p.batch_s:>14.3f} "
                f"{1e3 * p.iteration_s:>13.3f} {p.memory_bytes / 1e6:>9.3f} {'yes' if fits else 'no':>5}")
        if traversal is not None:
            x = traversal.find(p.microbatches, p.pipelines)
            line += f" {1e3 * x.batch_s:>14.3f} {x.memory_bytes / 1e6:>9.3f}"
        lines.append(line)
    chosen = report["chosen"]
    lines.append(f"chosen (M, N) = {tuple(chosen) if chosen else 'none fits the limit'}"
                 f"  (tuning took {report['tuning_s']:.2f} s)")
    if traversal is not None:
        t = report["traversal"]
        best = t["best"]
        ratio = t.get("pick_vs_best")
        lines.append(f"traversal best (M, N) = {tuple(best) if best else 'none fits'}  (traversal "
                     f"took {t['traversal_s']:.2f} s, {t['traversal_s'] / report['tuning_s']:.1f}x "
                     f"the tuning time)"
                     + (f"; the tuner's pick is {100 * (ratio - 1):.1f} % slower than the best"
                        if ratio is not None else ""))
    return "\n".join(lines)
