"""Benchmark: how far two profiles of the same model at ``pipeweave auto``'s micro-batch sizes
disagree, the sizes profiled one after the other (the old order) or interleaved
(:func:`pipeweave.measure.profile_sizes`; issue 29, item 2). ``--measure`` picks what is
measured at several sizes (each size's value, and its ratio to the first size's):

* ``profile`` (default): ``auto``'s profiles, the model's forward + backward in ms;
* ``colocated``: the co-located slowdown at ``auto``'s sizes (whole-step time under
  ``ranks - 1`` neighbours over alone; ``profiler.colocated.colocated_slowdowns``: one call
  of all sizes, or one call per size, the old order);
* ``tuner``: ``pipeweave tune``'s two profiles (its defaults: batch 16, (M, N) = (8, 1),
  calibrated against M = 1: 2 and 16 samples; ``measure.profile_cache`` given the sizes, or
  asked one size after the other, the old lazy order), forward + backward in ms.

(The JSON keeps each size's value under ``ms``, whatever it measures; ``unit`` says which.)

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/profile_sizes.py \
        [--measure profile|colocated|tuner] [--model gpt-tiny] [--ranks 2] [--pairs 2] \
        [--json-out benchmarks/results/profile_sizes.json]

Per order, ``--pairs`` pairs of profiles at the sizes ``auto --model M --ranks R`` profiles
(8, 4, 2 and 1 samples at 2 ranks), the orders alternating (sequential, interleaved,
sequential, interleaved, ...) so both see the same stretch of the machine's load. Reported per
profile: the whole model's forward + backward (ms, the sum of the blocks' medians; or the
slowdown) at each size, and each size's over the first (the default's) size, the ratio
``pipeweave auto``'s lines are drawn from; per pair and size: how far the two profiles disagree, ``max / min - 1``
of that size's time and of its ratio; per order, the median and the largest of a size's
ratio disagreement over the pairs. The load average is taken before and after each profile.
A loaded, shared machine moves everything: read the loads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeweave.data import build_dataset  # noqa: E402
from pipeweave.host import threads_per_rank  # noqa: E402
from pipeweave.measure import (auto_microbatch_sizes, profile_cache, profile_model,  # noqa: E402
                               profile_sizes, tuning_sizes)
from pipeweave.models import build_model  # noqa: E402
from pipeweave.profiler import Profile  # noqa: E402
from pipeweave.profiler.colocated import colocated_slowdowns  # noqa: E402

ORDERS = ("sequential", "interleaved")
MEASURES = ("profile", "colocated", "tuner")
TUNER = {"at": (8, 1), "smallest_m": 1, "batch_size": 16}
"""``pipeweave tune``'s defaults: --batch-size 16, --microbatches-grid 1,2,4,8,
--pipelines-grid 1,2,3, so --profile-at 8,1 and the calibration at M = 1."""


def _ms(profiles: list[Profile]) -> list[float]:
    return [1e3 * sum(b.forward + b.backward for b in p.blocks) for p in profiles]


def _profiles(order: str, model: str, ranks: int, sizes: tuple[int, ...]) -> list[float]:
    if order == "interleaved":
        return _ms(list(profile_sizes(model=model, batch_sizes=sizes, ranks=ranks)))
    return _ms([profile_model(model=model, batch_size=size, ranks=ranks) for size in sizes])


def _colocated(order: str, model: str, ranks: int, sizes: tuple[int, ...]) -> list[float]:
    spec = build_model(model)
    batches = [next(iter(build_dataset(spec.dataset or "digits", batch_size=size)))
               for size in sizes]
    options: dict[str, Any] = {"ranks": ranks, "threads": threads_per_rank(ranks)}
    if order == "interleaved":
        return list(colocated_slowdowns(spec, batches, batch_sizes=sizes, **options))
    return [colocated_slowdowns(spec, [batch], batch_sizes=(size,), **options)[0]
            for size, batch in zip(sizes, batches)]


def _tuner(order: str, model: str, ranks: int, sizes: tuple[int, ...]) -> list[float]:
    at = profile_cache(model, sizes=sizes if order == "interleaved" else ())
    return _ms([at(size) for size in sizes])


MEASURED = {"profile": _profiles, "colocated": _colocated, "tuner": _tuner}


def _one(measure: str, order: str, model: str, ranks: int,
         sizes: tuple[int, ...]) -> dict[str, Any]:
    load_before = os.getloadavg()
    started = time.perf_counter()
    values = dict(zip(sizes, MEASURED[measure](order, model, ranks, sizes)))
    wall = time.perf_counter() - started
    first = values[sizes[0]]
    return {"order": order, "wall_s": wall, "load_before": load_before,
            "load_after": os.getloadavg(), "ms": values,
            "ratio": {m: t / first for m, t in values.items()}}


def _disagreement(pair: list[dict[str, Any]], key: str) -> dict[int, float]:
    a, b = pair
    return {m: max(a[key][m], b[key][m]) / min(a[key][m], b[key][m]) - 1 for m in a[key]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", default="profile", choices=MEASURES)
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=2, help="pairs of profiles per order")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    sizes = tuning_sizes(**TUNER) if args.measure == "tuner" else \
        auto_microbatch_sizes(batch_size=None, ranks=args.ranks)
    runs: dict[str, list[dict[str, Any]]] = {order: [] for order in ORDERS}
    for _ in range(2 * args.pairs):
        for order in ORDERS:
            run = _one(args.measure, order, args.model, args.ranks, sizes)
            runs[order].append(run)
            print(f"{order:<12} load {run['load_before'][0]:5.2f} {run['wall_s']:5.1f} s  "
                  + "  ".join(f"{m}: {run['ms'][m]:7.2f} ({run['ratio'][m]:.2f})"
                              for m in sizes), flush=True)
    print(f"\n{'order':<12} {'pair':>4}  " + "  ".join(f"{f'time {m}':>9} {f'ratio {m}':>9}"
                                                     for m in sizes))
    summary: dict[str, list[dict[str, Any]]] = {}
    for order in ORDERS:
        for k in range(args.pairs):
            pair = runs[order][2 * k:2 * k + 2]
            times, ratios = _disagreement(pair, "ms"), _disagreement(pair, "ratio")
            summary.setdefault(order, []).append({"time": times, "ratio": ratios})
            print(f"{order:<12} {k:>4}  " + "  ".join(
                f"{100 * times[m]:8.1f}% {100 * ratios[m]:8.1f}%" for m in sizes))
    print(f"\n{'order':<12} {'':>4}  " + "  ".join(f"{f'ratio {m}':>19}" for m in sizes))
    overall: dict[str, dict[int, dict[str, float]]] = {}
    for order in ORDERS:
        overall[order] = {m: {"median": statistics.median(p["ratio"][m] for p in summary[order]),
                              "max": max(p["ratio"][m] for p in summary[order])} for m in sizes}
        print(f"{order:<12} {'all':>4}  " + "  ".join(
            f"median {100 * overall[order][m]['median']:4.1f}% max {100 * overall[order][m]['max']:4.1f}%"
            for m in sizes))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv), "measure": args.measure,
            "unit": "slowdown" if args.measure == "colocated" else "ms",
            "model": args.model, "ranks": args.ranks,
            "sizes": sizes, "runs": runs, "disagreement": summary,
            "ratio_disagreement": overall}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
