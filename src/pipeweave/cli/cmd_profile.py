"""``pipeweave profile``: measure every block of a model (and the link between two ranks).

    pipeweave profile --model gpt-tiny --batch-size 4 --json-out profile.json
    pipeweave profile --pipedream-graph vgg16/graph.txt --json-out vgg16.json   (import)

``--batch-size`` should be the micro-batch size you will train with: the planners take the
profiled times as the cost of one micro-batch. The link (ping-pong between two local processes
over gloo, or NCCL between two GPUs with ``--device cuda``) is measured unless ``--no-link``;
with ``--device cuda`` and fewer than two GPUs it is skipped, with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import devices
from ..models import available_models
from ..profiler import Profile, read_pipedream_graph
from ..profiler.link import measure_link
from ..measure import calibrate, calibration_skipped
from ..profiler.measure import profile_builtin
from ..host import threads_per_rank
from ..precision import PRECISIONS
from .model_options import add_hf_config, chosen_model

__all__ = ["add_parser", "run", "format_profile"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile", help="measure per-block times, activation and memory sizes, and the link",
        description=__doc__,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", choices=available_models(), help="built-in model to measure")
    add_hf_config(source)
    source.add_argument("--pipedream-graph", type=Path, metavar="GRAPH_TXT",
                        help="import PipeDream's profile (graph.txt) instead of measuring")
    parser.add_argument("--batch-size", type=int, default=4, help="samples per profiled micro-batch")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample (GPT models)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per block")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per block (median)")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads while measuring (default: on CPU what one of "
                             "--local-ranks training ranks gets, cores / local ranks, as "
                             "pipeweave train gives it; on CUDA torch's)")
    parser.add_argument("--local-ranks", type=int, default=2, metavar="R",
                        help="ranks that will train on this machine (sets the default "
                             "--threads on CPU)")
    parser.add_argument("--colocated-ranks", type=int, default=1, metavar="R",
                        help="also time whole steps while R-1 other processes train the same "
                             "model on this machine (CPU) and record the sharing overhead the "
                             "planner applies to ranks sharing the cores: give the local rank "
                             "count when the ranks will outnumber the cores")
    parser.add_argument("--precision", default="full", metavar="{" + ",".join(PRECISIONS) + "}",
                        help="measure as pipeweave train --precision will run: bf16-mixed "
                             "under autocast (bfloat16 times and activation bytes, float32 "
                             "weights), bf16 on bfloat16 copies (default full)")
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"],
                        help="optimizer whose state size is measured")
    parser.add_argument("--no-link", action="store_true",
                        help="skip measuring the point-to-point link between two local ranks")
    parser.add_argument("--no-runtime-costs", action="store_true",
                        help="skip measuring the runtime's fixed costs per action (short "
                             "single-process runs of the model; CPU, full precision), which "
                             "the planners add to the blocks' times")
    parser.add_argument("--json-out", type=Path, default=None, help="write the profile JSON here")
    parser.add_argument("--json", action="store_true", help="print the profile JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json_out is not None:
        from ..files import check_can_write

        check_can_write(args.json_out, "--json-out")
    if args.pipedream_graph is not None:
        profile = read_pipedream_graph(args.pipedream_graph)
    else:
        name, overrides = chosen_model(args)
        assert name is not None  # argparse requires --model, --hf-config or --pipedream-graph
        if args.seq_len is not None:
            overrides["seq_len"] = args.seq_len
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.colocated_ranks < 1:
            raise ValueError(f"--colocated-ranks must be >= 1 (the profiled rank included), got "
                             f"{args.colocated_ranks}")
        if args.local_ranks < 1:
            raise ValueError(f"--local-ranks must be >= 1, got {args.local_ranks}")
        devices.require_device(args.device)
        threads = args.threads
        if threads is None and args.device == "cpu":
            threads = threads_per_rank(args.local_ranks)
        profile = profile_builtin(name, batch_size=args.batch_size, seq_len=args.seq_len,
                                  device=args.device, warmup=args.warmup, repeats=args.repeats,
                                  optimizer=args.optimizer, overrides=overrides,
                                  threads=threads, colocated_ranks=args.colocated_ranks,
                                  precision=args.precision)
        if not args.no_link and args.device == "cuda" and devices.gpu_count() < 2:
            print(f"note: the GPU link was not measured: it needs two GPUs and "
                  f"{devices.gpu_count()} is visible (--no-link silences this)", file=sys.stderr)
        elif not args.no_link:
            profile = profile.with_link(measure_link(device=args.device))
        if not args.no_runtime_costs:
            skipped = calibration_skipped(device=args.device, precision=args.precision)
            if skipped is not None:
                print(f"note: {skipped} (--no-runtime-costs silences this)", file=sys.stderr)
            else:
                profile = calibrate(profile, model=name, overrides=overrides, seq_len=args.seq_len,
                                    link=False)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        profile.save(args.json_out)
    if args.json:
        print(json.dumps(profile.to_json()))
    else:
        print(format_profile(profile))
        if args.json_out is not None:
            print(f"wrote {args.json_out}")
    for warning in profile.metadata.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def format_profile(profile: Profile) -> str:
    """A table: one row per block, times in ms and sizes in KiB."""
    precision = profile.metadata.get("precision", "full")
    lines = [f"{profile.model}: {profile.num_blocks} blocks, batch {profile.batch_size}, "
             f"device {profile.device} ({profile.source})"
             + (f", precision {precision}" if precision != "full" else ""),
             f"{'block':>22} {'fwd ms':>9} {'bwd ms':>9} {'out KiB':>10} {'act KiB':>10} "
             f"{'param KiB':>10} {'optim KiB':>10}"]
    for b in profile.blocks:
        lines.append(f"{b.name[:22]:>22} {1e3 * b.forward:>9.3f} {1e3 * b.backward:>9.3f} "
                     f"{b.output_bytes / 1024:>10.1f} {b.activation_bytes / 1024:>10.1f} "
                     f"{b.parameter_bytes / 1024:>10.1f} {b.optimizer_bytes / 1024:>10.1f}")
    total = sum(profile.compute)
    lines.append(f"{'total':>22} {1e3 * sum(profile.forward):>9.3f} {1e3 * sum(profile.backward):>9.3f}"
                 f"   (forward+backward {1e3 * total:.3f} ms)")
    spreads = profile.metadata.get("spread") or {}
    if spreads:
        worst = max(spreads, key=lambda name: spreads[name])
        lines.append(f"spread (interquartile range / median of the timed runs): at most "
                     f"{100 * spreads[worst]:.0f} % ({worst}), {profile.metadata.get('threads')} "
                     f"thread(s)")
    if profile.link is not None:
        lines.append(f"link: {profile.link.bandwidth / 1e9:.3f} GB/s, latency "
                     f"{1e6 * profile.link.latency:.1f} us")
    if profile.runtime is not None:
        runtime = profile.runtime
        lines.append("runtime costs (us), per action + per further block: " + ", ".join(
            f"{kind} {1e6 * runtime.per_action[kind]:+.0f} {1e6 * runtime.per_block.get(kind, 0):+.0f}"
            for kind in runtime.per_action) + f"; per send {1e6 * runtime.per_message:.0f}")
    return "\n".join(lines)
