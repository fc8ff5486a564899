"""``pipeweave auto``: profile, search every technique by simulation, write the winner's plan.

    pipeweave auto --model gpt-tiny --ranks 2                     # profile, search, table
    pipeweave auto --model gpt-tiny --ranks 2 --run               # ... and train winner vs default
    pipeweave auto --profile big.json --ranks 16 --topology 4x1.2e10,4x1.25e9 \\
        --memory-limit 16GiB --semantics any --top 5 --json

The search (docs/auto.md, :mod:`pipeweave.auto`) covers every registered schedule
(asynchronous ones and APC only with ``--semantics any``), every partition method, M, chunks
per rank, AvgPipe's N, depth x width, recomputation, and the Slicer; it prunes with bounds
from the profile and simulates the rest. It prints the top ``--top`` candidates ranked by
predicted samples/s, writes the winner's plan to ``--out`` (run it with ``pipeweave train
--plan``) and the time/memory Pareto front to ``--plot``. The batch is fixed (``--batch-size``
samples per iteration) and every candidate splits it into its own micro-batches. ``--run``
trains the winner and the default plan (1F1B, uniform split, M = 2 x ranks) on local processes
in ``--rounds`` alternating rounds of about ``--run-seconds`` of timed iterations each (or
``--steps`` steps) and prints predicted against measured time (the median of the rounds,
and their spread) and memory per rank.
``--json`` prints one object: ``winner``, ``default``, ``considered``, ``pruned``,
``simulated``, ``invalid_ties`` (candidates left out because the runtime cannot keep a tied
parameter across their stages, with ``invalid_ties_reason``), ``table`` and, with ``--run``,
``measured``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..auto import AutoProblem, Prediction, SearchResult, plot_pareto, search
from ..measure.alternating import RUN_ROUNDS, TIMED_SECONDS
from ..model_names import model_names
from ..planner import Topology
from ..planner.sharding import SHARD_MODES
from ..profiler import Profile
from ..auto.problem import SEMANTICS, check_settings
from ..auto.time_to_loss import TimeToLoss, TimeToLossRanking
from .model_options import add_profile_source, check_profile_source, chosen_model
from .options import core_count, load_profile, parse_bytes, shared_cores
from .plan_exports import write_plan_exports

if TYPE_CHECKING:
    from ..measure import CalibrationFit
    from ..measure.calibration_retime import Retiming

__all__ = ["add_parser", "run", "format_table", "prediction_json"]

PILOT_STEPS = 6
"""Steps of each pilot under --semantics any when --steps is not given."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "auto", help="search schedule, split, M, N, depth x width, recomputation by simulation",
        description=__doc__)
    source = parser.add_argument_group("what to plan (give --model, --profile or both)")
    add_profile_source(
        source, repeat_profile=True, batch_size_default=None,
        profile_help="profile JSON from `pipeweave profile` (or PipeDream's graph.txt); repeat "
                     "it with profiles of the same model at other micro-batch sizes to "
                     "interpolate the times between them (the first is the reference)",
        batch_size_help="samples per iteration (default: the profile's micro-batch x 2 x "
                        "ranks); with --model and no --profile the model is profiled at "
                        "batch-size / (2 x ranks) samples per micro-batch")
    _add_search_arguments(parser)
    _add_output_arguments(parser)
    parser.set_defaults(func=run)


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster, the limits and the space searched."""
    parser.add_argument("--ranks", type=int, required=True, help="workers to plan for")
    parser.add_argument("--topology", default=None, metavar="MxB[,MxB...]",
                        help="hierarchical levels, lowest first: machines x bandwidth (bytes/s), "
                             "e.g. 4x1.2e10,4x1.25e9; default: one level at the profile's link")
    parser.add_argument("--memory-limit", default=None, metavar="BYTES",
                        help="memory per rank, e.g. 16e9 or 16GiB; a candidate predicted above "
                             "it is never chosen")
    parser.add_argument("--semantics", default="exact", choices=list(SEMANTICS),
                        help="what training the plans keep: exact (default): the updates of "
                             "training the same batch in one process; averaged: also AvgPipe's "
                             "N parallel pipelines (elastic averaging, N x the samples per "
                             "iteration); any: also asynchronous schedules and APC (stale "
                             "weights, lossy messages)")
    parser.add_argument("--top", type=int, default=10, help="rows of the table (and --json's); the slower candidates get their memory "
                             "predicted only as far as these rows need (the plot's dots)")
    parser.add_argument("--target-loss", type=float, default=None, metavar="LOSS",
                        help="with --semantics any and --model: rank the table's candidates by "
                             "predicted time to this training loss, from a pilot of --steps "
                             "steps of each (default: 1F1B's loss after --steps)")
    parser.add_argument("--schedules", default=None, metavar="A,B,...",
                        help="search only these schedules (default: every registered one)")
    parser.add_argument("--shard", default=None, metavar="none,full,grad-op",
                        help="how stages may be held over their data-parallel copies "
                             "(docs/sharding.md; default: none, and full and grad-op too "
                             "under --memory-limit)")
    parser.add_argument("--tp", default=None, metavar="auto|1,2,...",
                        help="tensor-parallel sizes to search (docs/sharding.md; default: 1, "
                             "and under --memory-limit every size the model can be split at)")
    parser.add_argument("--methods", default=None, metavar="A,B,...",
                        help="search only these partition methods (default: all)")
    parser.add_argument("--microbatches", default=None, metavar="M1,M2,...",
                        help="search only these micro-batch counts (default: w x d x 1,2,4,8 "
                             "and 2 x ranks, those that divide the batch)")
    parser.add_argument("--optimizer", default="adam",
                        choices=["sgd", "adam", "adamw", "rmsprop", "adagrad"],
                        help="the optimizer whose state the memory model counts (and --run uses)")
    parser.add_argument("--no-calibration", action="store_true",
                        help="with --model: skip measuring the link between two local ranks, "
                             "the runtime's fixed costs per action (short single-process "
                             "runs), the all-reduce's bandwidth, and the compute scale, "
                             "message latency, all-reduce cost and costs per action "
                             "(alternating runs of the default and a data-parallel plan at "
                             "two micro-batch sizes on --ranks processes), which the "
                             "simulator adds to the blocks' times")
    parser.add_argument("--profile-out", type=Path, default=None, metavar="FILE",
                        help="write the profile the search used (calibrated) here, for "
                             "`pipeweave plan --profile` or a later `auto --profile`")
    parser.add_argument("--shared-cores", default="auto", metavar="N|auto|none",
                        help="the ranks share N CPU cores (as in `pipeweave plan`); auto: a CPU "
                             "profile's cores when the ranks outnumber them; none: a device each")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop examining candidates after this long and take the best so "
                             "far (candidates go best bound first; the rest are counted as "
                             "unexamined); default: search everything")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What is written, and the optional run of the winner."""
    parser.add_argument("--out", type=Path, default=Path("auto-plan.json"),
                        help="write the winner's plan here (for pipeweave train --plan)")
    parser.add_argument("--plot", type=Path, default=Path("auto-pareto.png"),
                        help="write the time/memory Pareto front PNG here")
    parser.add_argument("--run", action="store_true",
                        help="train the winner and the default plan on local processes and "
                             "print predicted against measured time and memory per rank")
    parser.add_argument("--why", action="store_true",
                        help="say where the winner's and the default's iterations differ "
                             "(compute, updates, bubble, communication, memory) and write "
                             "their simulated timelines as PNGs beside --out")
    parser.add_argument("--steps", type=int, default=None,
                        help="with --run: steps per round of each plan (default: about "
                             "--run-seconds of timed iterations); with --semantics any and "
                             f"--model: steps of each pilot (default {PILOT_STEPS})")
    parser.add_argument("--rounds", type=int, default=RUN_ROUNDS,
                        help="with --run: rounds, each training the winner then the default "
                             "(the other way round in odd rounds); the median is reported")
    parser.add_argument("--run-seconds", type=float, default=TIMED_SECONDS, metavar="SECONDS",
                        help="with --run and no --steps: timed iterations per round")
    parser.add_argument("--no-retime", action="store_true",
                        help="with --run: do not time the calibration's plans again in the "
                             "same rounds (by default they are, to report how much the "
                             "machine drifted and the winner and default predicted again "
                             "from a fit of those rounds)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="with --run: seconds a rank waits for a peer")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(t.strip() for t in text.split(",") if t.strip())


def _counts(text: str | None) -> tuple[int, ...] | None:
    names = _names(text)
    if names is None:
        return None
    try:
        return tuple(int(n) for n in names)
    except ValueError:
        raise ValueError(f"--microbatches {text!r} must be whole numbers separated by commas, "
                         "e.g. 4,8,16") from None


def _say(text: str) -> None:
    print(f"auto: {text}", file=sys.stderr, flush=True)


def _profiles(args: argparse.Namespace) -> list[Profile]:
    """The given profiles, or the model profiled at the sizes
    :func:`~pipeweave.measure.auto_microbatch_sizes` gives (their timed runs interleaved,
    :func:`~pipeweave.measure.profile_sizes`); the first calibrated unless
    ``--no-calibration``."""
    model, overrides = chosen_model(args)
    if args.profile is not None:
        profiles = [load_profile(model=model, path=path, batch_size=args.batch_size,
                                 device=args.device, ranks=args.ranks, overrides=overrides)
                    for path in args.profile]
    else:
        from ..measure import auto_microbatch_sizes, profile_sizes  # torch, only to profile

        assert model is not None  # check_profile_source: a model or a profile
        sizes = auto_microbatch_sizes(batch_size=args.batch_size, ranks=args.ranks,
                                      microbatches=_counts(args.microbatches))
        _say(f"profiling {model} at {', '.join(map(str, sizes))} samples per micro-batch, "
             "interleaved ...")
        started = time.perf_counter()
        profiles = list(profile_sizes(model=model, batch_sizes=sizes, ranks=args.ranks,
                                      device=args.device, overrides=overrides))
        _say(f"profiled {profiles[0].num_blocks} blocks at {len(sizes)} sizes in "
             f"{time.perf_counter() - started:.1f} s")
    if model is not None and not args.no_calibration:
        profiles[0] = _calibrated(profiles[0], model, overrides, args.device)
    return profiles


def _calibrated(profile: Profile, model: str, overrides: dict[str, Any],
                device: str) -> Profile:
    from ..measure import calibrate

    if profile.link is not None and profile.runtime is not None \
            and profile.runtime.allreduce_bandwidth is not None:
        return profile
    started = time.perf_counter()
    _say("measuring the link and the runtime's costs per action ...")
    profile = calibrate(profile, model=model, overrides=overrides, device=device)
    _say(f"calibrated in {time.perf_counter() - started:.1f} s")
    return profile


def _check(args: argparse.Namespace) -> tuple[float | None, Topology | None]:
    """Every argument, before anything is profiled or run; the memory limit and topology."""
    from ..files import check_can_write
    from ..schedules import get_info
    from ..planner import get_method

    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    check_profile_source(args)
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    topology = Topology.parse(args.topology) if args.topology is not None else None
    check_settings(ranks=args.ranks, batch_size=args.batch_size, memory_limit=limit,
                   semantics=args.semantics, topology=topology,
                   shared_cores=core_count(args.shared_cores), optimizer=args.optimizer,
                   time_limit=args.time_limit)
    for name in _names(args.schedules) or ():
        get_info(name)
    for name in _names(args.methods) or ():
        get_method(name)
    for mode in _names(args.shard) or ():
        if mode not in SHARD_MODES:
            raise ValueError(f"--shard {args.shard!r}: {mode!r} is not one of "
                             f"{', '.join(SHARD_MODES)}; give e.g. --shard none,full")
    for count in _counts(args.microbatches) or ():
        if count < 1:
            raise ValueError(f"--microbatches {args.microbatches!r}: each count must be >= 1")
    _check_target(args)
    if args.no_retime and not args.run:
        raise ValueError("--no-retime only changes what --run times; add --run or drop "
                         "--no-retime")
    if args.run:
        _check_run(args)
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    for path, flag in ((args.out, "--out"), (args.plot, "--plot"),
                       (args.profile_out, "--profile-out")):
        if path is not None:
            check_can_write(path, flag)
    return limit, topology


def _check_run(args: argparse.Namespace) -> None:
    """``--steps``, ``--rounds`` and ``--run-seconds`` of ``--run``."""
    from ..measure import check_steps

    if args.steps is not None:
        check_steps(args.steps)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}; use --rounds 3")
    if not args.run_seconds > 0:
        raise ValueError(f"--run-seconds must be > 0, got {args.run_seconds}; use e.g. "
                         f"--run-seconds 1")


def _pilot_steps(args: argparse.Namespace) -> int:
    return args.steps if args.steps is not None else PILOT_STEPS


def _check_target(args: argparse.Namespace) -> None:
    """``--target-loss`` only where a time-to-loss ranking runs: --semantics any, a model."""
    if args.target_loss is not None and args.semantics != "any":
        raise ValueError(f"--target-loss ranks by time to loss, which only differs from "
                         f"samples/s when training may change: add --semantics any or drop "
                         f"--target-loss (--semantics {args.semantics} keeps the updates)")
    if args.semantics == "any" and chosen_model(args)[0] is None:
        if args.target_loss is not None:
            raise ValueError("--target-loss pilots each finalist on a built-in model: give "
                             "--model NAME, or drop --target-loss")
        return
    if args.semantics == "any":
        from ..measure import check_pilot  # torch: only where a pilot will run

        check_pilot(steps=_pilot_steps(args), target_loss=args.target_loss)


def _rank_by_time(args: argparse.Namespace, result: SearchResult
                  ) -> tuple[SearchResult, TimeToLossRanking | None]:
    """Under --semantics any with a model: the table's candidates piloted and re-ranked by
    predicted time to the target loss (:mod:`pipeweave.measure.pilot`)."""
    model, overrides = chosen_model(args)
    if args.semantics != "any" or model is None or not result.ranked:
        return result, None
    from ..measure import pilot_finalists  # torch: the pilots train

    _say(f"piloting the top {min(args.top, len(result.ranked))} candidates and 1F1B for "
         f"{_pilot_steps(args)} steps each to rank by time to loss ...")
    ranking = pilot_finalists(result, model=model, steps=_pilot_steps(args), top=args.top,
                              target=args.target_loss, optimizer=args.optimizer,
                              overrides=overrides, progress=_say)
    ranked = tuple(r.prediction for r in ranking.rows) + result.ranked[args.top:]
    return dataclasses.replace(result, ranked=ranked), ranking


def _fitted(args: argparse.Namespace,
            problem: AutoProblem) -> tuple[AutoProblem, CalibrationFit | None]:
    """``problem`` with the message latency and the all-reduce's fixed cost fitted to
    alternating runs of the default and a data-parallel plan (a model given, calibration on,
    a CPU run; :mod:`pipeweave.measure.calibration_runs`), and the fit."""
    model, overrides = chosen_model(args)
    if model is None or args.no_calibration:
        return problem, None
    from ..measure import calibration_skipped, fit_calibration, plan_timer  # torch

    skipped = calibration_skipped(device=args.device, precision="full")
    if skipped is not None:
        _say(f"note: {skipped}; no message latency fitted either (--no-calibration silences "
             "this)")
        return problem, None
    started = time.perf_counter()
    _say(f"timing the default and data-parallel plans on {args.ranks} local processes to fit "
         "the message latency, the all-reduce and the costs per action ...")
    timer = plan_timer(model=model, batch_size=problem.batch, timeout_s=args.timeout,
                       overrides=overrides)
    problem, fit = fit_calibration(problem, time_one=timer, say=_say)
    if fit is not None:
        for label, rounds in fit.measured.items():
            _say(f"{label} plan measured {1e3 * rounds.median:.1f} ms per iteration (spread "
                 f"{100 * rounds.spread:.0f} %), predicted {1e3 * fit.predicted_before[label]:.1f}"
                 f" ms before the fit, {1e3 * fit.predicted_after[label]:.1f} ms after")
        words = {"message_latency": "message latency", "allreduce_latency": "all-reduce cost",
                 "action_overhead": "per action",
                 "compute_per_action": "compute per action",
                 "compute_per_receive": "compute per received message"}
        _say(f"fitted compute x{fit.fitted['compute_scale']:.3f}"
             + "".join(f", {words[name]} +{1e6 * value:.0f} us"
                       for name, value in fit.fitted.items() if name in words)
             + (f", a waiting rank {fit.fitted['wait_share']:.2f} of a core"
                if "wait_share" in fit.fitted else "")
             + f" ({time.perf_counter() - started:.1f} s)")
    return problem, fit


def _tp(args: argparse.Namespace, limit: float | None) -> tuple[int, ...] | None:
    from .auto_tp import auto_tp_sizes

    model, overrides = chosen_model(args)
    return auto_tp_sizes(args.tp, model=model, overrides=overrides, ranks=args.ranks,
                         limited=limit is not None)


def run(args: argparse.Namespace) -> int:
    limit, topology = _check(args)
    sizes = _tp(args, limit)  # the runtime's own check, before anything is profiled
    profile, *others = _profiles(args)
    problem = AutoProblem(
        profile=profile, extra_profiles=tuple(others), ranks=args.ranks, batch_size=args.batch_size,
        memory_limit=limit, semantics=args.semantics, topology=topology,
        shared_cores=shared_cores(args.shared_cores, profile, args.ranks),
        optimizer=args.optimizer, time_limit=args.time_limit, schedules=_names(args.schedules),
        methods=_names(args.methods), microbatches=_counts(args.microbatches),
        shard=_names(args.shard), tp=sizes, table_rows=args.top)
    unfitted = problem
    problem, fit = _fitted(args, problem)
    if args.profile_out is not None:
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        problem.profile.save(args.profile_out)
    _say(f"searching {profile.model} ({profile.num_blocks} blocks) on {args.ranks} ranks, "
         f"batch {problem.batch} ...")
    result, ranking = _rank_by_time(args, search(problem, progress=_say))
    winner = result.winner  # a clear error when nothing fits
    args.out.parent.mkdir(parents=True, exist_ok=True)
    winner.plan.save(args.out)
    shown = list(result.ranked) + list(result.over_limit)
    if result.default is not None:
        shown.append(result.default)  # always predicted, so always on the plot
    plot = plot_pareto(shown, args.plot, winner=winner,
                       default=result.default, memory_limit=problem.memory_limit,
                       title=f"pipeweave auto: {profile.model} on {args.ranks} ranks")
    report = report_json(result, args.top, ranking)
    report["plan_file"] = str(args.out)
    report["plan_exports"] = write_plan_exports(
        winner.plan, [b.name for b in profile.blocks], batch_size=problem.batch, plan_file=args.out)
    if fit is not None:
        report["calibration"] = fit.to_json()
    report["plot"] = str(plot)
    if args.run:
        from ..measure.calibration_retime import Retiming

        retiming = Retiming(unfitted, fit) if fit is not None and not args.no_retime else None
        report["measured"], retimed = _measure(args, problem, result, retiming)
        if retimed is not None:
            report["retimed"] = retimed
    if args.why:
        report["why"] = _why(args, problem, result)
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(args, result, report, problem, ranking)
    return 0


def _print_report(args: argparse.Namespace, result: SearchResult, report: dict[str, Any],
                  problem: AutoProblem, ranking: TimeToLossRanking | None = None) -> None:
    """The table, the measured runs, and where the plan and its exports went."""
    winner, profile = result.winner, problem.profile
    print(format_table(result, args.top, ranking))
    if "measured" in report:
        print(format_measured(report))
    if "why" in report:
        print(report["why"]["text"])
    model = f" --model {profile.model}" if profile.model in model_names() else ""
    if getattr(args, "hf_config", None) is not None:  # the preset of that name is another model
        model = f" --hf-config {args.hf_config}"
    apc = " --apc" if winner.candidate.apc else ""
    print(f"wrote {args.out} (run it: pipeweave train{model} --plan {args.out} --batch-size "
          f"{problem.batch}{apc}) and {report['plot']}")
    for system, written in report["plan_exports"].items():
        print(f"  {system}: {written}")


def _why(args: argparse.Namespace, problem: AutoProblem,
         result: SearchResult) -> dict[str, Any]:
    """``--why``: the winner's and the default's iterations split, their timelines drawn."""
    from ..auto.why import breakdown, differences, format_breakdowns, write_timeline

    rows, images = [], {}
    for label, prediction in (("winner", result.winner), ("default", result.default)):
        if prediction is None:
            continue
        row, simulated = breakdown(prediction, problem, label=label)
        rows.append(row)
        images[label] = str(write_timeline(
            simulated, args.out.with_suffix(f".why-{label}.png"),
            title=f"{label}: {prediction.plan.schedule}, {len(prediction.plan.stages)} stages, "
                  f"M={prediction.plan.microbatches} (simulated)"))
    lines = [format_breakdowns(rows)]
    if len(rows) == 2:
        lines += differences(rows[0], rows[1])
    lines += [f"{label} timeline: {path}" for label, path in images.items()]
    return {"breakdown": [dataclasses.asdict(row) for row in rows], "timelines": images,
            "text": "\n".join(lines)}


def _measure(args: argparse.Namespace, problem: AutoProblem, result: SearchResult,
             retiming: Retiming | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``--run``: the winner and the default measured, and the calibration's plans re-timed
    beside them (``retiming``; :mod:`pipeweave.measure.calibration_retime`)."""
    from ..measure import measure_predictions

    model, overrides = chosen_model(args)
    model = model or problem.profile.model
    if model not in model_names():
        raise ValueError(f"--run trains a built-in model, and the profile is of {model!r}; "
                         f"give --model NAME (one of {', '.join(model_names())}) or drop "
                         "--run")
    plans = {label: p for label, p in (("winner", result.winner), ("default", result.default))
             if p is not None}
    options: dict[str, Any] = dict(model=model, batch_size=problem.batch, rounds=args.rounds,
                                   seconds=args.run_seconds, steps=args.steps,
                                   optimizer=args.optimizer, timeout_s=args.timeout,
                                   overrides=overrides, say=_say)
    if retiming is None:
        return measure_predictions(plans, **options), None
    from ..measure import measure_alongside, plan_timer
    from ..measure.calibration_retime import retimed_report

    timer = plan_timer(model=model, batch_size=problem.batch, timeout_s=args.timeout,
                       overrides=overrides)  # as the calibration timed them (_fitted)
    compared, timed = measure_alongside(plans, beside=retiming.beside(), beside_timer=timer,
                                        **options)
    return compared, retimed_report(retiming, timed, plans, compared)


def prediction_json(p: Prediction) -> dict[str, Any]:
    c = p.candidate
    return {
        "schedule": c.schedule, "method": c.method, "stages": [list(s) for s in p.plan.stages],
        "microbatches": c.microbatches, "pipelines": c.pipelines, "depth": c.depth,
        "width": c.width, "chunks": c.chunks, "replicas": list(c.replicas) if c.replicas
        else None, "recompute": sum(p.plan.recompute),
        "recompute_per_stage": [p.plan.recompute_stage(s) for s in range(len(p.plan.stages))],
        "apc": c.apc, "shard": c.shard, "tp": c.tp, "training": c.training(),
        "predicted_iteration_time": p.iteration_time,
        "predicted_samples_per_second": p.samples_per_second,
        "predicted_bubble_fraction": p.bubble_fraction,
        "predicted_peak_memory_bytes": list(p.peak_memory_bytes),
        "plan": p.plan.to_json(),
    }


def time_to_loss_json(row: TimeToLoss | None) -> dict[str, Any]:
    """A table row's time-to-loss fields (empty when the table is ranked by samples/s)."""
    if row is None:
        return {}
    return {"loss_per_sample": row.slope, "loss_per_sample_vs_1f1b": row.relative_slope,
            "piloted": row.piloted, "predicted_samples_to_target": row.samples,
            "predicted_seconds_to_target": row.seconds}


def _rows_of(ranking: TimeToLossRanking | None) -> dict[int, TimeToLoss]:
    return {} if ranking is None else {id(r.prediction): r for r in ranking.rows}


def report_json(result: SearchResult, top: int,
                ranking: TimeToLossRanking | None = None) -> dict[str, Any]:
    problem = result.problem
    rows = _rows_of(ranking)
    return {
        "ranked_by": "time to loss" if ranking is not None else "samples per second",
        "time_to_loss": None if ranking is None else {
            "target_loss": ranking.target, "start_loss": ranking.start,
            "loss_per_sample_1f1b": ranking.baseline_slope, "pilot_steps": ranking.steps},
        "model": problem.profile.model, "ranks": problem.ranks, "batch_size": problem.batch,
        "memory_limit": problem.memory_limit, "semantics": problem.semantics,
        "winner": prediction_json(result.winner),
        "default": prediction_json(result.default) if result.default is not None else None,
        "considered": result.considered, "invalid": result.invalid, "pruned": result.pruned,
        "pruned_time": result.pruned_time, "pruned_memory": result.pruned_memory,
        "simulated": result.simulated, "duplicates": result.duplicates,
        "unexamined": result.unexamined, "over_budget": result.over_budget,
        "over_memory_limit": len(result.over_limit), "search_seconds": result.seconds,
        "invalid_ties": result.refused_ties, "invalid_ties_reason": result.tie_reason,
        "table": [{**prediction_json(p), **time_to_loss_json(rows.get(id(p)))}
                  for p in result.ranked[:top]],
    }


def _split(p: Prediction) -> str:
    sizes = [e - a for a, e in p.plan.stages]
    text = "+".join(map(str, sizes)) if len(sizes) <= 8 else \
        f"{len(sizes)} stages of {min(sizes)}..{max(sizes)}"
    return f"{p.candidate.method} {text}"


def _memory(p: Prediction) -> str:
    mib = [m / 2**20 for m in p.peak_memory_bytes]
    if len(mib) <= 4:
        return " ".join(f"{m:.1f}" for m in mib)
    return f"{min(mib):.1f}..{max(mib):.1f}"


def _shape(p: Prediction) -> str:
    c = p.candidate
    text = f"{c.depth}x{c.width}" if c.replicas is None else f"RR {list(c.replicas)}"
    return text + (f" v{c.chunks}" if c.chunks > 1 else "") + (
        f" {c.shard}" if c.shard != "none" else "") + (f" tp{c.tp}" if c.tp > 1 else "")


def _time_cells(row: TimeToLoss | None) -> tuple[str, ...]:
    """The time-to-loss columns: learning per sample against 1F1B's, seconds to the target."""
    if row is None:
        return ("", "")
    seconds = "never" if row.seconds is None else f"{row.seconds:.2f}"
    return (f"{row.relative_slope:.2f}" + ("" if row.piloted else "="), seconds)


def format_table(result: SearchResult, top: int,
                 ranking: TimeToLossRanking | None = None) -> str:
    times = _rows_of(ranking)
    extra = ("per sample x1F1B", "s to target") if ranking is not None else ()
    rows: list[tuple[str, ...]] = [("#", "schedule", "split (blocks per stage)", "M", "N", "dxw",
                                    "recomp", "apc", "samples/s", "peak MiB per rank", "bubble",
                                    "training", *extra)]

    def row(label: str, p: Prediction) -> tuple[str, ...]:
        c = p.candidate
        return (label, c.schedule, _split(p), str(c.microbatches), str(c.pipelines), _shape(p),
                c.recompute_label(len(p.plan.stages)), "on" if c.apc else "off",
                f"{p.samples_per_second:.1f}", _memory(p), f"{p.bubble_fraction:.3f}",
                c.training(), *(_time_cells(times.get(id(p))) if ranking is not None else ()))

    for index, p in enumerate(result.ranked[:top]):
        rows.append(row(str(index + 1), p))
    if result.default is not None:
        rows.append(row("default", result.default))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    problem = result.problem
    head = (f"pipeweave auto: {problem.profile.model}, {problem.ranks} ranks, batch "
            f"{problem.batch}, semantics {problem.semantics}"
            + (f", memory limit {problem.memory_limit / 2**20:.1f} MiB"
               if problem.memory_limit is not None else ""))
    ties = (f" ({result.refused_ties} split a tied parameter over stages their schedule "
            f"cannot keep, e.g. {result.tie_reason})" if result.refused_ties else "")
    counts = (f"{result.considered} candidates considered: {result.invalid} invalid{ties}, "
              f"{result.pruned} pruned ({result.pruned_time} by time, {result.pruned_memory} by "
              f"memory), {result.simulated} simulated ({result.duplicates} duplicates, "
              f"{len(result.over_limit)} over the memory limit)"
              + (f", {result.unexamined} left unexamined by --time-limit" if result.unexamined
                 else "")
              + (f", {result.over_budget} skipped as too long for the time left"
                 if result.over_budget else "") + f" in {result.seconds:.2f} s")
    winner, default = result.winner, result.default
    lines = [head, *lines, counts, *_ranking_lines(result, ranking)]
    if default is not None:
        lines.append(f"winner {winner.samples_per_second / default.samples_per_second:.2f}x the "
                     f"default plan's predicted samples/s")
    rule = learning_rule(winner, result.problem.batch)
    if rule:
        lines.append(rule)
    return "\n".join(lines)


def _ranking_lines(result: SearchResult, ranking: TimeToLossRanking | None) -> list[str]:
    """What the table is ranked by, under --semantics any."""
    if ranking is not None:
        return [f"ranked by predicted time to loss {ranking.target:.4f} (from {ranking.start:.4f}"
                f"): samples needed at each plan's loss per sample (pilots of {ranking.steps} "
                f"steps in one process; '=' an exact plan, 1F1B's) / predicted samples/s"]
    if result.problem.semantics == "any":
        return ["ranked by predicted samples/s: ranking by time to loss pilots a built-in "
                "model; give --model NAME"]
    return []


def learning_rule(p: Prediction, batch: int) -> str:
    """What the winner changes in the training, in one line ("" when it keeps it exact)."""
    c = p.candidate
    kept = c.training()
    if kept == "averaged":
        return (f"note: the winner changes the learning rule: AvgPipe trains N={c.pipelines} "
                f"models, each updated on its own batch of {batch} samples and averaged "
                f"elastically with a reference model, {c.pipelines * batch} samples per "
                f"iteration (docs/avgpipe.md); --semantics exact keeps one-process training")
    if kept == "stale weights":
        return (f"note: the winner changes the learning rule: {c.schedule} updates with stale "
                f"weights (docs/semantics.md); --semantics exact keeps one-process training")
    if kept == "lossy messages":
        return ("note: the winner changes the numbers trained: APC sends activations and "
                "gradients in fp16 (docs/precision.md); --semantics exact keeps them exact")
    return ""


def format_measured(report: dict[str, Any]) -> str:
    lines = [f"{'plan':<8} {'predicted s/iter':>17} {'measured s/iter':>16} {'error':>7} "
             f"{'spread':>7}  peak MiB per rank, predicted / measured"]
    for label, m in report["measured"].items():
        memory = " ".join(f"{p / 2**20:.1f}/{q / 2**20:.1f}" for p, q in
                          zip(m["predicted_peak_memory_bytes"], m["peak_memory_bytes"]))
        lines.append(f"{label:<8} {m['predicted_iteration_time']:>17.4f} "
                     f"{m['iteration_time']:>16.4f} {100 * m['iteration_time_error']:>6.1f}% "
                     f"{100 * m.get('spread', 0.0):>6.1f}%  {memory}")
    first: dict[str, Any] = next(iter(report["measured"].values()), {})
    rounds = first.get("rounds")
    if rounds is not None:
        lines.append(f"measured: median of {len(rounds)} alternating rounds; spread = (slowest "
                     "- fastest round) / median")
    if "retimed" in report:
        lines += format_retimed(report)
    return "\n".join(lines)


def format_retimed(report: dict[str, Any]) -> list[str]:
    """The calibration plans re-timed in the same rounds: their drift since the calibration,
    and the winner and default predicted again from a fit of those rounds."""
    drift = ", ".join(f"{label} {1e3 * p['calibration_median']:.1f} -> {1e3 * p['median']:.1f} "
                      f"ms ({100 * p['drift']:+.0f} %)"
                      for label, p in report["retimed"]["plans"].items())
    again = ", ".join(f"{label} {m['retimed_prediction']:.4f} s ({100 * m['retimed_error']:.1f} "
                      "% off)" for label, m in report["measured"].items()
                      if "retimed_prediction" in m)
    return [f"calibration plans re-timed in the same rounds (machine drift since the "
            f"calibration): {drift}",
            f"predicted again from a fit of those rounds (no run of these plans in it): {again}"]
