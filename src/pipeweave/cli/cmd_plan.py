"""``pipeweave plan``: partition a model over ranks and write a plan ``pipeweave train`` runs.

    pipeweave plan --model gpt-tiny --ranks 2 --method autopipe --out plan.json
    pipeweave train --model gpt-tiny --plan plan.json
    pipeweave plan --profile vgg16.json --ranks 16 --method pipedream --topology 16x1e9 --json

With ``--model`` the model is profiled first (on this machine, ``--batch-size`` samples per
micro-batch, no link measurement; on CPU, when the ranks outnumber the cores, also under the
load of that many co-located ranks, see ``profiler.colocated``); with ``--profile`` the JSON
profile (or PipeDream's ``graph.txt``) is read. ``--shared-cores`` (default ``auto``: the
profiling machine's cores when a CPU profile's ranks outnumber them) simulates the ranks
sharing that many cores, as local processes on a CPU machine do. ``--json`` prints the
report: ``stages`` (block ranges), ``replicas``, ``balance`` (max/mean stage time),
``predicted_iteration_time`` (simulated seconds per iteration), ``planning_seconds`` and the
method's own numbers (``shared_cores`` and ``sharing_overhead`` when the cores are shared),
with the plan under ``plan``.
``--out`` writes only the plan, which ``Plan.load`` / ``pipeweave train --plan`` read.
``--slicer`` prices the Slicer's halves (Algorithm 2's ``k`` and the simulated iteration)
from the profile at half the micro-batch, as ``auto`` and ``simulate`` do: with ``--model``
both sizes are profiled, interleaved; a ``--profile`` is scaled to half its micro-batch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..models import available_models
from .model_options import add_profile_source, check_profile_source
from .options import core_count, parse_bytes, profile_from_args, shared_cores
from ..planner import PlanRequest, PlanResult, Topology, available_methods, make_plan
from ..planner.result import check_request
from ..planner.plan import Plan
from ..profiler import Profile

__all__ = ["add_parser", "run", "format_result"]

def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="partition a model over ranks (uniform, parameters, time, pipedream, autopipe)",
        description=__doc__,
    )
    source = parser.add_argument_group("what to plan (give --model, --profile or both)")
    add_profile_source(source)
    parser.add_argument("--ranks", type=int, required=True, help="workers to plan for")
    parser.add_argument("--method", required=True, help=f"one of {', '.join(available_methods())}")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="M, micro-batches per iteration (default 2 x ranks)")
    parser.add_argument("--memory-limit", default=None, metavar="BYTES",
                        help="memory per worker, e.g. 16e9 or 16GiB")
    parser.add_argument("--topology", default=None, metavar="MxB[,MxB...]",
                        help="hierarchical levels, lowest first: machines x bandwidth (bytes/s), "
                             "e.g. 4x1.2e10,4x1.25e9; default: one level at the profile's link")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="shorthand for a single level --topology RANKSxBANDWIDTH")
    parser.add_argument("--straight", action="store_true", help="pipedream: no stage replication")
    parser.add_argument("--sum-allreduce", action="store_true",
                        help="pipedream: add all-reduce to compute instead of overlapping them")
    parser.add_argument("--slicer", action="store_true",
                        help="AutoPipe Slicer: sliced-1f1b with Algorithm 2's k")
    parser.add_argument("--schedule", default=None,
                        help="override the method's schedule; 'fastest': the synchronous "
                             "schedule (1f1b, gpipe, zb-h1, zb-h2, ...) the simulator predicts "
                             "fastest for the method's split within --memory-limit")
    parser.add_argument("--shared-cores", default="auto", metavar="N|auto|none",
                        help="the ranks share N CPU cores (simulated with the cores split among "
                             "the ranks computing at once); auto: a CPU profile's cores when the "
                             "ranks outnumber them; none: a device per rank")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, default=None, help="write the plan JSON here")
    parser.set_defaults(func=run)


def _check_ties(plan: Plan, profile: Profile) -> None:
    """Refuse, before writing it, a plan ``pipeweave train`` would refuse for its ties."""
    from ..auto.ties import TieRefused, check_ties

    try:
        check_ties(plan, profile)
    except TieRefused as error:
        raise ValueError(f"the plan puts {error}; pipeweave train refuses it: choose another "
                         f"--schedule (1f1b keeps a split tie exact) or a split that keeps the "
                         f"tied blocks on one stage") from None


def _check(args: argparse.Namespace) -> tuple[float | None, Topology | None]:
    """Every argument, before anything is profiled; the memory limit and the topology."""
    from ..files import check_can_write
    from ..planner import get_method
    from ..schedules import get_info

    check_profile_source(args)
    if args.topology is not None and args.bandwidth is not None:
        raise ValueError("give --topology or --bandwidth, not both")
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    topology = Topology.parse(args.topology) if args.topology is not None else None
    check_request(ranks=args.ranks, microbatches=args.microbatches, memory_limit=limit,
                  topology=topology, shared_cores=core_count(args.shared_cores))
    if args.bandwidth is not None:
        topology = Topology.single(args.ranks, args.bandwidth)
    get_method(args.method)
    if args.schedule not in (None, "fastest"):
        get_info(args.schedule)
    if args.out is not None:
        check_can_write(args.out, "--out")
    return limit, topology


def _profiles(args: argparse.Namespace) -> tuple[Profile, Profile | None]:
    """The profile, and with ``--slicer`` the profile at half its micro-batch (``ceil(b /
    2)`` samples) to price the Slicer's halves by: with ``--model``, both sizes profiled now,
    their timed runs interleaved; with ``--profile``, the profile scaled to it
    (:mod:`pipeweave.auto.scaling`, as ``pipeweave simulate`` prices them)."""
    if not args.slicer:
        return profile_from_args(args, ranks=args.ranks), None
    if args.profile is not None:
        from dataclasses import replace

        from ..auto.scaling import scaled_profile

        profile = profile_from_args(args, ranks=args.ranks)
        sized = profile if profile.batch_size else replace(profile, batch_size=2)  # unknown: even
        assert sized.batch_size is not None
        return profile, scaled_profile(sized, max(1, (sized.batch_size + 1) // 2))
    from ..measure import profile_sizes
    from .model_options import chosen_model

    model, overrides = chosen_model(args)
    assert model is not None  # check_profile_source: a model or a profile
    sizes = (args.batch_size, max(1, (args.batch_size + 1) // 2))
    profiles = profile_sizes(model=model, batch_sizes=sizes if sizes[1] < sizes[0] else sizes[:1],
                             ranks=args.ranks, device=args.device, overrides=overrides)
    return profiles[0], profiles[-1]


def run(args: argparse.Namespace) -> int:
    limit, topology = _check(args)
    profile, half = _profiles(args)
    request = PlanRequest(
        profile=profile, ranks=args.ranks, microbatches=args.microbatches,
        memory_limit=limit, topology=topology, straight=args.straight, slicer=args.slicer, schedule=args.schedule,
        allreduce_overlap=not args.sum_allreduce,
        shared_cores=shared_cores(args.shared_cores, profile, args.ranks), half_profile=half,
    )
    result = make_plan(request, args.method)
    _check_ties(result.plan, profile)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result.plan.save(args.out)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_result(result, profile))
        if args.out is not None:
            model = f" --model {profile.model}" if profile.model in available_models() else ""
            print(f"wrote {args.out}; run it with: pipeweave train{model} --plan {args.out}")
    return 0


def format_result(result: PlanResult, profile: Profile) -> str:
    plan = result.plan
    lines = [f"{result.method}: {profile.model}, {profile.num_blocks} blocks on "
             f"{plan.world_size} ranks, schedule {plan.schedule}, M={plan.microbatches}",
             f"{'stage':>5} {'blocks':>11} {'replicas':>8} {'time ms':>9}  first .. last block"]
    for s, ((a, e), r, t) in enumerate(zip(plan.stages, result.replicas, result.stage_times)):
        names = profile.blocks[a].name if e - a == 1 else \
            f"{profile.blocks[a].name} .. {profile.blocks[e - 1].name}"
        lines.append(f"{s:>5} {f'[{a}, {e})':>11} {r:>8} {1e3 * t:>9.3f}  {names}")
    lines.append(f"balance (max/mean stage time) {result.balance:.4f}")
    lines.append(f"predicted iteration time {1e3 * result.predicted_iteration_time:.3f} ms "
                 "(simulated)")
    for key in ("predicted_time_per_minibatch", "noam", "algorithm1_iteration_time", "sliced"):
        if key in result.details:
            value = result.details[key]
            lines.append(f"{key.replace('_', ' ')} {value:.6g}" if isinstance(value, float)
                         else f"{key.replace('_', ' ')} {value}")
    lines.extend(_slicer_line(result))
    for name, outcome in result.details.get("schedules", {}).items():
        chosen = " (chosen)" if name == plan.schedule else ""
        lines.append(f"  schedule {name}: {1e3 * outcome:.3f} ms{chosen}"
                     if isinstance(outcome, float) else f"  schedule {name}: left out, {outcome}")
    lines.append(f"planning time {result.planning_seconds:.4f} s")
    return "\n".join(lines)


def _slicer_line(result: PlanResult) -> list[str]:
    """With ``--slicer``: the same plan without the Slicer, and which is predicted faster (the
    Slicer is run as asked even where it is predicted slower; this line says so)."""
    without = result.details.get("iteration_time_without_slicer")
    if not isinstance(without, float) or without <= 0:
        return []
    ratio = result.predicted_iteration_time / without
    verdict = (f"the Slicer is predicted {100 * (1 - ratio):.1f} % faster" if ratio < 1 else
               f"the Slicer is predicted {100 * (ratio - 1):.1f} % slower: drop --slicer"
               if ratio > 1 else "the Slicer is predicted to change nothing")
    return [f"without the Slicer {1e3 * without:.3f} ms (simulated): {verdict}"]

