"""Benchmark: the planner's predicted iteration time against real runs of the same plans.

Run::

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/simulator_fidelity.py
        [--model gpt-small] [--ranks 2 4] [--rounds 3] [--steps 6]
        [--json-out benchmarks/results/simulator_fidelity.json]

For each rank count R, several plans of the built-in GPT that really differ (the planner's
balanced 1F1B, the same split under GPipe and under the Slicer, and a mildly and a strongly
unbalanced split) are predicted with the simulator (``planner.Evaluator``, the costs the
planners use) and run with real processes (``launch_local``: gloo over loopback). Measured
iteration time: the median time between consecutive iteration ends on the runtime's own
timeline, the first iteration left out.

This machine's speed drifts by ±10 % over minutes (a shared VM), so a profile taken once and
runs spread over ten minutes would measure the drift, not the simulator. Each **round**
therefore profiles again (the intra-op threads a rank gets; when the ranks outnumber the cores
also under the load of co-located ranks, ``profiler.colocated``, for the sharing overhead, and
the plans are then simulated with the ranks sharing the cores, ``Costs.shared_cores``) and runs
every plan straight after; the
error of a plan is the median over rounds of |predicted - measured| / measured with both from
the same round. Even so the speed moves within a round, so a second column separates the
simulator from the profile: **replay** simulates the same schedule with the forward, backward
and update times the run itself measured per stage (the link from the profile; a device per
rank, since measured times already carry the sharing): its error is the simulator's own
(dependencies, transfers, overlap); the planner's error adds the profile's and, with shared
cores, the sharing model's.
Ranking: plans ordered by median prediction and by median measurement; a pair counts when the
predictions differ by more than ``--tie`` (closer plans are a coin toss for the runs too) and
is right when both orders agree.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeweave.ir import Op, parse_action
from pipeweave.models.gpt import GPT_PRESETS
from pipeweave.planner import Evaluator, PlanRequest, make_plan
from pipeweave.planner.methods import straight_network
from pipeweave.profiler import Profile
from pipeweave.profiler.link import measure_link
from pipeweave.profiler.measure import profile_builtin
from pipeweave.profiler.colocated import needed_colocation
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan
from pipeweave.host import machine_cores, threads_per_rank
from pipeweave.runtime.launch.processes import launch_local
from pipeweave.runtime.observation.summary import iteration_end_times
from pipeweave.runtime.observation.timeline import Record

MICROBATCH = 4  # samples per micro-batch (what the profile measures)


@dataclass(frozen=True)
class Candidate:
    label: str
    stages: tuple[tuple[int, int], ...]
    schedule: str
    options: dict[str, Any]


def skewed(bounds: tuple[tuple[int, int], ...], blocks: int, shift: int) -> tuple[tuple[int, int], ...]:
    """Move ``shift`` blocks from the first stage to the second (the first stays non-empty)."""
    cuts = [e for _, e in bounds[:-1]]
    cuts[0] = max(1, cuts[0] - shift)
    for i in range(1, len(cuts)):
        cuts[i] = max(cuts[i], cuts[i - 1] + 1)
    edges = [0, *cuts, blocks]
    return tuple(zip(edges[:-1], edges[1:]))


def candidates(profile: Profile, ranks: int, microbatches: int) -> list[Candidate]:
    balanced = make_plan(PlanRequest(profile, ranks, microbatches=microbatches), "autopipe").plan
    sliced = make_plan(PlanRequest(profile, ranks, microbatches=microbatches, slicer=True),
                       "autopipe").plan
    blocks = profile.num_blocks
    per_stage = blocks // ranks
    return [
        Candidate("balanced 1f1b", balanced.stages, "1f1b", {}),
        Candidate("balanced gpipe", balanced.stages, "gpipe", {}),
        Candidate("balanced sliced-1f1b", sliced.stages, sliced.schedule, dict(sliced.schedule_options)),
        Candidate("skewed 1f1b", skewed(balanced.stages, blocks, max(1, per_stage // 3)), "1f1b", {}),
        Candidate("very skewed 1f1b", skewed(balanced.stages, blocks, max(2, 2 * per_stage // 3)),
                  "1f1b", {}),
    ]


def predict(profile: Profile, ranks: int, microbatches: int, candidate: Candidate,
            shared_cores: int | None = None) -> float:
    network = straight_network(PlanRequest(profile, ranks, microbatches=microbatches,
                                           shared_cores=shared_cores))
    evaluator = Evaluator(profile, candidate.schedule, len(candidate.stages), microbatches,
                          network, None, candidate.options)
    return evaluator(candidate.stages).iteration_time


def measured_stage_costs(records: list[Record], stages: int, microbatches: int,
                         steps: int) -> dict[str, list[float]]:
    """Per stage: mean forward and backward seconds per micro-batch and update seconds per
    iteration, over iterations 2..K of the run (sliced halves add up to their micro-batch)."""
    busy: dict[tuple[Op, int], float] = defaultdict(float)
    for _, text, start, end in records:
        action = parse_action(text)
        if action.op in (Op.FORWARD, Op.BACKWARD) and action.microbatch is not None:
            iteration = action.microbatch // microbatches
        elif action.op is Op.STEP and action.version is not None:
            iteration = action.version - 1
        else:
            continue
        if iteration >= 1:
            busy[(action.op, action.stage)] += end - start
    timed = steps - 1
    return {"forward": [busy[(Op.FORWARD, s)] / (timed * microbatches) for s in range(stages)],
            "backward": [busy[(Op.BACKWARD, s)] / (timed * microbatches) for s in range(stages)],
            "update": [busy[(Op.STEP, s)] / timed for s in range(stages)]}


def with_stage_costs(profile: Profile, stages: tuple[tuple[int, int], ...],
                     costs: dict[str, list[float]]) -> Profile:
    """``profile`` with every stage's blocks scaled so that the stage sums equal ``costs``."""
    blocks = list(profile.blocks)
    for s, (a, e) in enumerate(stages):
        factors = {}
        for kind in ("forward", "backward", "update"):
            total = sum(getattr(b, kind) for b in blocks[a:e])
            factors[kind] = costs[kind][s] / total if total > 0 else 1.0
        for i in range(a, e):
            blocks[i] = replace(blocks[i], **{k: getattr(blocks[i], k) * f for k, f in factors.items()})
    return replace(profile, blocks=tuple(blocks))


def measure(model: str, ranks: int, microbatches: int, candidate: Candidate, steps: int,
            blocks: int) -> tuple[float, dict[str, list[float]]]:
    plan = Plan(num_blocks=blocks, stages=candidate.stages, schedule=candidate.schedule,
                microbatches=microbatches, schedule_options=candidate.options)
    job = Job(plan=plan, steps=steps, model=BuiltinModel(model),
              data=BuiltinData("stdlib-bytes", batch_size=MICROBATCH * microbatches,
                               seq_len=GPT_PRESETS[model].seq_len),
              optimizer=OptimizerFactory("adam"), timeout_s=180)
    results = launch_local(job, deadline_s=600)
    records = [r for result in results for r in result.records]
    ends = iteration_end_times(records, microbatches, steps)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return (statistics.median(gaps[1:] if len(gaps) > 2 else gaps),
            measured_stage_costs(records, len(candidate.stages), microbatches, steps))


def ranking(rows: list[dict[str, Any]], tie: float) -> dict[str, Any]:
    counted = agreed = 0
    for a, b in itertools.combinations(rows, 2):
        pa, pb = a["predicted_s"], b["predicted_s"]
        if abs(pa - pb) / min(pa, pb) <= tie:
            continue
        counted += 1
        agreed += (pa < pb) == (a["measured_s"] < b["measured_s"])
    return {"predicted": [r["plan"] for r in sorted(rows, key=lambda r: r["predicted_s"])],
            "measured": [r["plan"] for r in sorted(rows, key=lambda r: r["measured_s"])],
            "pairs_counted": counted, "pairs_agreeing": agreed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-small", choices=sorted(GPT_PRESETS))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, default=None, help="default 2 x ranks")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="profile + run every plan, N times")
    parser.add_argument("--tie", type=float, default=0.03,
                        help="predictions closer than this (relative) are not ranked")
    parser.add_argument("--shared-cores", default="auto", metavar="N|auto|none",
                        help="simulate the ranks sharing N cores (and profile the sharing "
                             "overhead under co-located ranks); auto: this machine's cores when "
                             "the ranks outnumber them")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    link = measure_link()
    print(f"link: {link.bandwidth / 1e9:.2f} GB/s, latency {1e6 * link.latency:.0f} us; "
          f"{machine_cores()} cores", flush=True)
    report: dict[str, Any] = {"model": args.model, "cores": machine_cores(), "rounds": args.rounds,
                              "steps": args.steps, "tie": args.tie, "ranks": {}}
    for ranks in args.ranks:
        microbatches = args.microbatches or 2 * ranks
        if args.shared_cores == "none":
            cores = None
        elif args.shared_cores == "auto":
            cores = machine_cores() if needed_colocation(ranks) > 1 else None
        else:
            cores = int(args.shared_cores)
        colocated = ranks if cores is not None else 1
        samples: dict[str, list[tuple[float, float, float]]] = {}
        plans: list[Candidate] = []
        overheads: list[float | None] = []
        for round_index in range(args.rounds):
            started = time.perf_counter()
            profile = profile_builtin(args.model, batch_size=MICROBATCH, repeats=7,
                                      threads=threads_per_rank(ranks),
                                      colocated_ranks=colocated).with_link(link)
            if not plans:
                plans = candidates(profile, ranks, microbatches)
            for candidate in plans:
                predicted = predict(profile, ranks, microbatches, candidate, cores)
                measured, costs = measure(args.model, ranks, microbatches, candidate, args.steps,
                                          profile.num_blocks)
                replayed = predict(with_stage_costs(profile, candidate.stages, costs), ranks,
                                   microbatches, candidate)
                samples.setdefault(candidate.label, []).append((predicted, measured, replayed))
                print(f"R={ranks} round {round_index} {candidate.label:<22} predicted "
                      f"{1e3 * predicted:8.1f} ms  measured {1e3 * measured:8.1f} ms  error "
                      f"{100 * (predicted - measured) / measured:+6.1f} %  replay "
                      f"{100 * (replayed - measured) / measured:+6.1f} %", flush=True)
            overhead = profile.metadata.get("sharing_overhead")
            overheads.append(overhead)
            print(f"  round {round_index}: {time.perf_counter() - started:.0f} s"
                  + (f", sharing overhead {overhead:.3f}" if overhead else ""), flush=True)
        rows = []
        for candidate in plans:
            pairs = samples[candidate.label]
            rows.append({
                "plan": candidate.label, "schedule": candidate.schedule,
                "stages": [list(s) for s in candidate.stages],
                "predicted_s": statistics.median(p for p, _, _ in pairs),
                "measured_s": statistics.median(m for _, m, _ in pairs),
                "replayed_s": statistics.median(r for _, _, r in pairs),
                "error": statistics.median(abs(p - m) / m for p, m, _ in pairs),
                "replay_error": statistics.median(abs(r - m) / m for _, m, r in pairs),
                "signed_errors": [(p - m) / m for p, m, _ in pairs],
                "signed_replay_errors": [(r - m) / m for _, m, r in pairs],
            })
        report["ranks"][str(ranks)] = {"shared_cores": cores, "microbatches": microbatches,
                                       "sharing_overheads": overheads, "plans": rows, "ranking": ranking(rows, args.tie)}

    print(f"\n{'ranks':>5} {'plan':<22} {'stages':<34} {'predicted ms':>12} {'measured ms':>12} "
          f"{'error %':>8} {'replay err %':>12}")
    for ranks, entry in report["ranks"].items():
        for row in entry["plans"]:
            stages = " ".join(f"{a}-{b}" for a, b in row["stages"])
            print(f"{ranks:>5} {row['plan']:<22} {stages:<34} {1e3 * row['predicted_s']:>12.1f} "
                  f"{1e3 * row['measured_s']:>12.1f} {100 * row['error']:>8.1f} "
                  f"{100 * row['replay_error']:>12.1f}")
    for ranks, entry in report["ranks"].items():
        rank = entry["ranking"]
        sharing = (f"{entry['shared_cores']} shared cores" if entry["shared_cores"]
                   else "a core per rank")
        print(f"R={ranks} ({sharing}): "
              f"{rank['pairs_agreeing']}/{rank['pairs_counted']} pairs ranked as measured\n"
              f"   predicted {rank['predicted']}\n   measured  {rank['measured']}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
