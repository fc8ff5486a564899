"""``pipeweave placement``: where a depth x width hybrid's traffic goes on a hierarchical cluster.

    pipeweave placement --model gpt-tiny --topology 4x1.2e10,4x1.25e9 --depth 4
    pipeweave placement --profile profile.json --topology 4x1.2e10,4x1.25e9 --depth 4 --json
    pipeweave placement --topology 4x1.2e10,4x1.25e9 --depth 4 --p2p-bytes 1e9 --allreduce-bytes 1e8

WPipe's placement (wpipe.txt A.3, Table 3; ``pipeweave.planner.placement``): every way to put
pipeline depth ``d`` (``--depth``) and data-parallel width ``w = workers / d`` on the
topology's levels, ranked by predicted communication time per iteration (point-to-point
transfers summed over the boundaries, plus the slowest stage's all-reduce), with WPipe's rule
and the runtime's rank map marked. With a profile (``--model``, profiled now, or
``--profile``) the model is cut into ``d`` time-balanced stages, the traffic comes from it
(``2 M/w`` block outputs per boundary, each stage's parameter bytes) and each placement's
iteration is also simulated under ``1f1b`` with its links (``pipeweave.sim``, a device per
rank). ``pipeweave train`` runs only the ``runtime`` map (copy ``k`` on ranks ``k d .. k d +
d - 1``, launchers numbering ranks machine by machine): the other rows are predictions.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..planner import Evaluator, Topology, min_max_partition
from ..planner.placement import Placement, placements, profile_traffic
from ..profiler import Profile
from .model_options import add_profile_source
from .options import profile_from_args

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "placement", help="rank the placements of a depth x width hybrid on a hierarchical "
                          "topology (WPipe)", description=__doc__)
    source = parser.add_argument_group(
        "the traffic (give --model, --profile, or --p2p-bytes and --allreduce-bytes)")
    add_profile_source(source)
    source.add_argument("--p2p-bytes", type=float, default=None,
                        help="bytes over every pipeline boundary per iteration (both directions)")
    source.add_argument("--allreduce-bytes", type=float, default=None,
                        help="bytes every stage all-reduces per iteration")
    parser.add_argument("--topology", required=True, metavar="MxB[,MxB...]",
                        help="hierarchical levels, lowest first: machines x bandwidth (bytes/s), "
                             "e.g. 4x1.2e10,4x1.25e9")
    parser.add_argument("--depth", type=int, required=True,
                        help="pipeline depth d; the width is the topology's workers / d")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="with a profile: M per iteration over all copies, a multiple of "
                             "the width (default 2 x workers)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topology = Topology.parse(args.topology)
    depth = args.depth
    if depth < 1 or topology.workers % depth:
        raise ValueError(f"--depth {depth} does not divide the topology's {topology.workers} "
                         f"workers; give a divisor of {topology.workers}")
    width = topology.workers // depth
    explicit = args.p2p_bytes is not None or args.allreduce_bytes is not None
    has_profile = args.model is not None or args.profile is not None or args.hf_config is not None
    if explicit and has_profile:
        raise ValueError("give the traffic either from a model (--model/--profile) or as "
                         "--p2p-bytes and --allreduce-bytes, not both")
    report: dict[str, Any] = {"topology": topology.to_json(), "depth": depth, "width": width}
    simulated: dict[int, float] = {}
    if explicit:
        if args.p2p_bytes is None or args.allreduce_bytes is None:
            raise ValueError("give both --p2p-bytes and --allreduce-bytes")
        if args.microbatches is not None:
            raise ValueError("--microbatches needs a profile (--model or --profile); the given "
                             "byte counts are already per iteration")
        found = placements(topology, depth, width, p2p_bytes=args.p2p_bytes,
                           allreduce_bytes=args.allreduce_bytes)
    else:
        _total(args.microbatches, topology, width)  # before profiling
        profile = profile_from_args(args, ranks=topology.workers)  # co-located ranks profiled
        found, simulated = _from_profile(profile, topology, depth, width, args.microbatches,
                                         report)
    rows = []
    for index, placement in enumerate(found):
        row = placement.to_json()
        if simulated:
            row["simulated_iteration_time"] = simulated[index]
        rows.append(row)
    report["placements"] = rows
    if args.json:
        print(json.dumps(report))
    else:
        print(_format(report, found, simulated))
    return 0


def _total(microbatches: int | None, topology: Topology, width: int) -> int:
    """Micro-batches per iteration (default 2 x workers), a positive multiple of ``width``."""
    total = microbatches if microbatches is not None else 2 * topology.workers
    if total < 1 or total % width:
        raise ValueError(f"--microbatches {total} is not a positive multiple of the width "
                         f"{width}; use a multiple of {width}")
    return total


def _from_profile(profile: Profile, topology: Topology, depth: int, width: int,
                  microbatches: int | None, report: dict[str, Any]
                  ) -> tuple[list[Placement], dict[int, float]]:
    total = _total(microbatches, topology, width)
    if depth > profile.num_blocks:
        raise ValueError(f"--depth {depth} exceeds the model's {profile.num_blocks} blocks; "
                         f"use at most {profile.num_blocks}")
    bounds, _ = min_max_partition(profile.compute, depth)
    per_copy = total // width
    p2p, reduce = profile_traffic(profile, bounds, per_copy)
    found = placements(topology, depth, width, p2p_bytes=p2p, allreduce_bytes=reduce)
    latency = profile.link.latency if profile.link is not None else 0.0
    simulated = {
        index: Evaluator(profile, "1f1b", depth, total, placement.network(latency),
                         replicas=(width,) * depth if width > 1 else None)(bounds).iteration_time
        for index, placement in enumerate(found)
    }
    report.update(model=profile.model, stages=[list(b) for b in bounds], microbatches=total,
                  p2p_bytes=p2p, allreduce_bytes=reduce)
    return found, simulated


def _format(report: dict[str, Any], found: list[Placement], simulated: dict[int, float]) -> str:
    depth, width = report["depth"], report["width"]
    topology = ",".join(f"{lv['machines']}x{lv['bandwidth']:g}" if lv["bandwidth"] else
                        f"{lv['machines']}xinf" for lv in report["topology"])
    head = f"placements of depth {depth} x width {width} on {topology}"
    if "model" in report:
        head += (f" ({report['model']}, stages {report['stages']}, M={report['microbatches']}, "
                 f"simulated under 1f1b)")
    lines = [head, f"{'':2}{'placement':<15} {'pipeline/data per level':<24} {'p2p s':>10} "
                   f"{'all-reduce s':>12} {'comm s':>10}"
                   + (f" {'iteration s':>12}" if simulated else "")]
    for index, p in enumerate(found):
        split = "x".join(map(str, p.pipeline_split)) + " / " + "x".join(map(str, p.data_split))
        marks = [m for m, on in (("runtime", p.runtime), ("WPipe's rule", p.wpipe_rule)) if on]
        lines.append(f"{index + 1:<2}{p.name:<15} {split:<24} {p.p2p_time:>10.4g} "
                     f"{p.allreduce_time:>12.4g} {p.communication_time:>10.4g}"
                     + (f" {simulated[index]:>12.4g}" if simulated else "")
                     + (f"  {', '.join(marks)}" if marks else ""))
    lines.append("runtime: the rank map `pipeweave train` runs (copy k on ranks k*d .. k*d+d-1); "
                 "the other rows are predictions")
    return "\n".join(lines)
