"""``pipeweave train``: train a model across local ranks (or under torchrun).

With no arguments: GPT-tiny on the standard-library byte corpus, 2 ranks, ``1f1b``. Prints a
summary table and writes, under ``--output-dir``: ``metrics.jsonl``/``metrics.csv`` (per
step), ``summary.json``, ``plan.json``, ``trace.json`` (Chrome trace of the measured
timeline) and ``loss.png``.

Checkpoints: ``--checkpoint-every N`` writes one every N steps (an asynchronous schedule drains
there, docs/semantics.md) and at the end into ``--checkpoint-dir`` (default ``<output-dir>/checkpoints``); ``--resume DIR``
continues from one (any plan), ``--resume auto`` from the newest in ``--checkpoint-dir`` if
there is one (for ``torchrun --max-restarts``). See docs/checkpoints.md.

Your own data: ``--data PATH`` (a text file or folder, byte-level or ``--tokenizer DIR``;
a ``.bin``/``.npy`` token file), ``--eval-every N`` for a held-out loss; see docs/data.md and
:mod:`pipeweave.cli.data_options`.

AvgPipe (``--schedule avgpipe``): ``--pipelines N``, ``--alpha A``, ``--advance auto|K|all``
and ``--memory-limit BYTES``; ``--advance auto`` chooses the advance at run time (Algorithm 1).
See docs/avgpipe.md and :mod:`pipeweave.cli.train_avgpipe`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..data import SEQUENCE_DATASETS
from ..models import available_models, default_seq_len
from ..runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan
from ..runtime.checkpoint.options import CheckpointOptions
from ..runtime.checkpoint.store import OUTPUT_SUBFOLDER
from ..runtime.job import DTYPES, IMPLEMENTATIONS
from ..planner.sharding import SHARD_MODES
from ..models import ModelSpec
from ..precision import PRECISIONS, check_precision
from ..runtime.launch.prepare import prepare
from ..runtime.launch.processes import launch_local, run_under_torchrun, under_torchrun
from ..runtime.launch.single_process import run_local
from ..runtime.observation.summary import TrainSummary, summarize
from ..schedules import schedule_defaults
from . import train_avgpipe, train_failure
from .options import parse_bytes, parse_mesh, parse_options
from .train_outputs import write_outputs
from .model_options import add_hf_config, add_hf_pretrained, chosen_model
from .data_options import add_data_options, held_out, own_data
from .run_folder import Opened, new_run_folder, open_outputs

__all__ = ["add_parser", "run"]

DEFAULT_MODEL = "gpt-tiny"
DEFAULT_SCHEDULE = "1f1b"
DEFAULT_STAGES = 2
DEFAULT_MICROBATCHES = 4
PLAN_FLAGS = ("schedule", "stages", "microbatches", "chunks", "width", "option", "recompute",
              "shard", "mesh")
"""What a plan file fixes; given beside ``--plan`` they are refused (the plan would win)."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train", help="train a model with a pipeline schedule on local ranks",
        description=__doc__,
    )
    _add_shape_arguments(parser)
    _add_optimizer_arguments(parser)
    _add_run_arguments(parser)
    _add_checkpoint_arguments(parser)
    add_data_options(parser)
    train_avgpipe.add_arguments(parser)
    parser.set_defaults(func=run)


def _add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and the pipeline's shape (what a plan file fixes)."""
    parser.add_argument("--model", default=None, choices=available_models(),
                        help=f"model to train (default {DEFAULT_MODEL})")
    add_hf_config(parser)
    add_hf_pretrained(parser)
    parser.add_argument("--schedule", default=None,
                        help=f"schedule name (see `pipeweave schedules`; default {DEFAULT_SCHEDULE})")
    parser.add_argument("--stages", type=int, default=None,
                        help=f"pipeline depth P (ranks per pipeline; default {DEFAULT_STAGES})")
    parser.add_argument("--microbatches", type=int, default=None,
                        help=f"M, micro-batches per step (default {DEFAULT_MICROBATCHES}, or the "
                             f"schedule's least M where that is more, e.g. P for 2bw)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (iterations)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per step")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample (GPT models)")
    parser.add_argument("--chunks", type=int, default=None,
                        help="model chunks per rank (default: the schedule's own, 2 for "
                             "interleaved-1f1b and wpipe, else 1)")
    parser.add_argument("--width", type=int, default=None,
                        help="data-parallel copies of the pipeline (default 1)")
    parser.add_argument("--mesh", default=None, metavar="pp=P,dp=D,tp=T",
                        help="the ranks as a mesh: pp=P,dp=D is --stages P --width D; tp=T "
                             "splits each stage's layers over T processes (built-in GPT; "
                             "docs/sharding.md)")
    parser.add_argument("--shard", default=None, choices=list(SHARD_MODES),
                        help="hold each stage over its dp ranks with FSDP2: full (ZeRO-3), "
                             "grad-op (ZeRO-2) or none (replicated, the default); needs dp > 1 "
                             "and a synchronous schedule without split backward "
                             "(docs/sharding.md)")
    parser.add_argument("--no-prefetch-gathers", action="store_true",
                        help="with --shard: gather each block when FSDP2's hook fires, not one "
                             "action early in the schedule's order (docs/sharding.md)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="schedule option, e.g. sliced=2 (repeatable)")
    parser.add_argument("--plan", type=Path, default=None,
                        help="plan JSON (pipeweave plan --json-out); it fixes the schedule, "
                             "stages, micro-batches, chunks, width, options and recomputation, "
                             "so those flags are refused beside it")


def _add_optimizer_arguments(parser: argparse.ArgumentParser) -> None:
    """The optimizer and what each update computes (clipping, recomputation, compression)."""
    parser.add_argument("--optimizer", default=None, choices=["sgd", "adam", "adamw", "rmsprop", "adagrad", "nadam"],
                        help="torch.optim optimizer (default: the schedule's own, SGD with "
                             "momentum 0.9 for spectrain, else adam)")
    parser.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX",
                        help="clip the global gradient norm of every update to MAX, across all "
                             "stages, as torch.nn.utils.clip_grad_norm_ on the whole model "
                             "(synchronous schedules; default: no clipping); with zb-h2 and "
                             "--option post_validation=true the check runs after the step and "
                             "undoes it when it clips, so iterations still overlap")
    parser.add_argument("--optimizer-impl", default="auto", choices=list(IMPLEMENTATIONS),
                        help="how torch runs the step: fused kernels where torch has them for "
                             "the optimizer and device (auto), or forced fused / foreach / loop")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--momentum", type=float, default=None,
                        help="SGD momentum (default 0, or the schedule's: 0.9 for spectrain)")
    parser.add_argument("--recompute", action="store_true", help="recompute activations on every stage")
    parser.add_argument("--prediction-backward", default=None, choices=["recompute", "graph"],
                        help="pipeoptim: backward at the current weights by recomputing the "
                             "stage (recompute, the paper's rule and the default) or through the "
                             "graph built on the predicted weights (graph: no second forward)")
    parser.add_argument("--apc", action="store_true",
                        help="automatic precision compression: send float activations/gradients "
                             "between ranks as fp16 with a power-of-two scaler (WPipe; about half "
                             "the bytes, relative error <= 2**-11)")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Precision, device, executor and the run's outputs."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="the model's dtype: its parameters, gradients and optimizer state "
                             "(the master weights under --precision bf16-mixed)")
    parser.add_argument("--precision", default="full", metavar="{" + ",".join(PRECISIONS) + "}",
                        help="full (default): everything in --dtype; bf16-mixed: float32 master "
                             "weights and optimizer state, every stage's forward and loss under "
                             "torch.autocast(bfloat16); bf16: parameters, optimizer state and "
                             "activations in bfloat16. fp16 is refused (see docs/precision.md)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--executor", default="processes", choices=["processes", "local"],
                        help="real processes (default) or the single-process executor")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a peer")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where metrics, summary, plan, trace and checkpoints go (default: "
                             "a new runs/<date>-<time>-<schedule>/ per run, with runs/latest "
                             "linking to it)")
    parser.add_argument("--json-out", type=Path, default=None, help="write the summary JSON here too")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--count-activations", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="count the activation bytes each rank holds (the summary's "
                             "'activations' and 'state' columns; docs/memory.md). Default: on "
                             "the CPU yes, on a GPU no: a Python hook per saved tensor cost "
                             "17%% of a 551M Llama's step on an H100, where the allocator's "
                             "peak (the 'peak memory' column) is exact anyway")
    parser.add_argument("--tensorboard", action="store_true",
                        help="also write TensorBoard event files (loss, samples/s per step) to "
                             "tensorboard/ in the output folder; needs pip install -e "
                             "'.[tensorboard]'")
    parser.add_argument("--debug", action="store_true",
                        help="when a rank fails, print its full traceback as well (it is always "
                             "written to error.log in the output folder)")


def _add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="write checkpoints here (every --checkpoint-every steps and at the end)")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                        help="checkpoint every N steps (0: only at the end); implies "
                             "--checkpoint-dir <output-dir>/checkpoints if none is given")
    parser.add_argument("--resume", default=None, metavar="DIR|auto",
                        help="continue from a checkpoint directory (or one step-* folder in it); "
                             "'auto': from --checkpoint-dir's newest checkpoint if any")


@dataclass(frozen=True)
class Setup:
    """What the command line describes: the job, its model (built once here) and the
    ``--memory-limit`` in bytes (parsed once)."""

    job: Job
    spec: ModelSpec
    memory_limit: float | None


def build_job(args: argparse.Namespace) -> Job:
    """The :class:`Job` the command line describes."""
    return build_setup(args).job


def build_setup(args: argparse.Namespace) -> Setup:
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    check_precision(args.precision, dtype=DTYPES[args.dtype], apc=args.apc)
    apply_mesh(args)
    check_counts(args)
    name, overrides = chosen_model(args, default=DEFAULT_MODEL)
    assert name is not None
    if args.seq_len is not None:
        overrides["seq_len"] = args.seq_len
    # What needs no model is checked before the model is built (an HF model takes seconds).
    plan = load_plan(args) if args.plan is not None else None
    schedule = plan.schedule if plan is not None else args.schedule or DEFAULT_SCHEDULE
    stages = plan.depth if plan is not None else \
        DEFAULT_STAGES if args.stages is None else args.stages
    defaults = schedule_defaults(
        schedule, stages, chunks=args.chunks if plan is None else plan.chunks,
        width=(args.width or 1) if plan is None else plan.width,
        microbatches=DEFAULT_MICROBATCHES, optimizer=("adam", {}))
    optimizer = optimizer_for(args, defaults.optimizer)
    checkpoint = checkpoint_options(args)
    options = parse_options(args.option)
    model = BuiltinModel(name, seed=args.seed, dtype=args.dtype, overrides=overrides)
    spec = model()
    if plan is None:
        recompute = (True,) * (stages * defaults.chunks) if args.recompute else ()
        plan = Plan.uniform(len(spec.blocks), stages, chunks=defaults.chunks, schedule=schedule,
                            microbatches=(defaults.microbatches if args.microbatches is None
                                          else args.microbatches),
                            width=1 if args.width is None else args.width, recompute=recompute,
                            schedule_options=options, shard=args.shard or "none",
                            tp=getattr(args, "tp", 1))
    dataset = spec.dataset or "digits"
    seq_len = None
    if dataset in SEQUENCE_DATASETS:
        seq_len = default_seq_len(name, **overrides)
    own = own_data(args, spec, name=name, seq_len=seq_len)
    if args.prediction_backward is not None:
        plan = replace(plan, semantics=replace(plan.semantics, backward=args.prediction_backward))
    plan, advance = train_avgpipe.apply(args, plan, spec, optimizer, limit)
    job = Job(
        plan=plan, steps=args.steps, model=model, checkpoint=checkpoint,
        data=own if own is not None else BuiltinData(
            dataset, batch_size=args.batch_size, seq_len=seq_len, seed=args.seed,
            dtype=args.dtype),
        optimizer=optimizer, seed=args.seed, device=args.device, advance=advance,
        timeout_s=args.timeout, progress=not args.no_progress, apc=args.apc,
        clip_grad_norm=args.clip_grad_norm, precision=args.precision,
        count_activations=(args.device == "cpu" if args.count_activations is None
                           else args.count_activations),
        eval_every=args.eval_every, prefetch_gathers=not args.no_prefetch_gathers,
    )
    return Setup(job, spec, limit)


COUNTS = ("steps", "batch_size", "stages", "microbatches", "chunks", "width")
"""Flags that count something, refused below 1 before anything is built."""


def apply_mesh(args: argparse.Namespace) -> None:
    """``--mesh pp=P,dp=D,tp=T``: the long form of ``--stages P --width D`` (refused beside
    them) and the tensor-parallel size ``args.tp`` (1 without ``--mesh``); ``--shard`` refused
    with the single-process executor, before anything is built."""
    if args.shard not in (None, "none") and args.executor == "local":
        raise ValueError(f"--shard {args.shard} shards each stage over its ranks' own process "
                         f"group; --executor local runs every rank in one process: use "
                         f"--executor processes, or --shard none")
    args.tp = 1
    if args.mesh is None:
        return
    given = [flag for flag, value in (("--stages", args.stages), ("--width", args.width))
             if value is not None]
    if given:
        raise ValueError(f"--mesh {args.mesh} and {' '.join(given)} both give the shape; "
                         f"give one of them")
    args.stages, args.width, args.tp = parse_mesh(args.mesh)


def check_counts(args: argparse.Namespace) -> None:
    """The counts and the timeout, whatever the model (its size is checked later)."""
    for name in COUNTS:
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= 1, got {value}; give {flag} 1 or more")
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got "
                         f"{args.checkpoint_every}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")


def load_plan(args: argparse.Namespace) -> Plan:
    """``--plan FILE``, refused beside the flags it fixes or when it cannot be read."""
    given = [f"--{name}" for name in PLAN_FLAGS if getattr(args, name) not in (None, [], False)]
    if given:
        raise ValueError(
            f"--plan {args.plan} fixes the split and schedule, and {', '.join(given)} would "
            f"be ignored; drop {'them' if len(given) > 1 else 'it'}, or edit the plan file "
            f"(or make a new one with pipeweave plan)")
    if not args.plan.exists():
        raise ValueError(f"--plan {args.plan}: no such file; make one with `pipeweave plan "
                         f"--out {args.plan}` or give the path of an existing plan")
    return Plan.load(args.plan)


def optimizer_for(args: argparse.Namespace,
                  schedule_default: tuple[str, Mapping[str, Any]] | None) -> OptimizerFactory:
    """``--optimizer``/``--lr``/``--momentum``, with the schedule's own optimizer where the
    user named none (SpecTrain needs SGD with momentum)."""
    kwargs: dict[str, Any] = {"lr": args.lr}
    name = args.optimizer
    if name is None:
        name, defaults = schedule_default if schedule_default is not None else ("adam", {})
        if name == "sgd" and args.momentum is None:
            kwargs.update(defaults)
    if args.momentum is not None:
        if name != "sgd":
            raise ValueError(f"--momentum applies to --optimizer sgd only, the optimizer is "
                             f"{name}; add --optimizer sgd or drop --momentum")
        kwargs["momentum"] = args.momentum
    return OptimizerFactory(name, kwargs, implementation=args.optimizer_impl)


def checkpoint_options(args: argparse.Namespace) -> CheckpointOptions | None:
    directory = args.checkpoint_dir
    if directory is None and args.checkpoint_every:
        directory = args.output_dir / OUTPUT_SUBFOLDER
    if directory is None and args.resume is None:
        return None
    return CheckpointOptions(directory=None if directory is None else str(directory),
                             every=args.checkpoint_every, resume=args.resume)


def check_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ValueError("--tensorboard needs the tensorboard package; install it with "
                         "pip install -e '.[tensorboard]' or drop --tensorboard") from None


def _writable(args: argparse.Namespace, job: Job) -> list[tuple[Path, str]]:
    """The folders the run writes to, each with the flag that names it."""
    folders = [(Path(args.output_dir), "--output-dir")]
    if args.json_out is not None:
        folders.append((args.json_out.parent, "--json-out's folder"))
    if job.checkpoint is not None and job.checkpoint.directory is not None:
        folders.append((Path(job.checkpoint.directory), "--checkpoint-dir"))
    return folders


def run(args: argparse.Namespace) -> int:
    fresh_folder = args.output_dir is None
    if fresh_folder:  # a name only: nothing is created before every check has passed
        args.output_dir = new_run_folder(
            args.schedule, args.plan, DEFAULT_SCHEDULE,
            torchrun_id=os.environ.get("TORCHELASTIC_RUN_ID", "torchrun") if under_torchrun()
            else None)
    if args.tensorboard:
        check_tensorboard()
    setup = build_setup(args)
    job = setup.job
    reports = not (under_torchrun() and int(os.environ["RANK"]) != 0)  # torchrun: rank 0 does
    train_avgpipe.check_ranks(args, job.plan, under_torchrun=under_torchrun())
    # Every check, once, before any rank starts (a checkpoint that does not fit stops us here;
    # under torchrun each process checks, and rank 0 verifies the shards' checksums).
    ready = prepare(job, spec=setup.spec, verify_checksums=reports)
    train_avgpipe.warn_shared_devices(args, job.plan, under_torchrun=under_torchrun())
    opened = open_outputs(_writable(args, job), fresh=args.output_dir if fresh_folder else None
                          ) if reports else Opened()
    first_step = ready.first_step
    if ready.session is not None and ready.session.resume_from is not None and reports:
        print(f"resuming from {ready.session.resume_from} after step {first_step} of {job.steps}")
    try:
        if under_torchrun():
            results = run_under_torchrun(ready)
            if not results:
                return 0  # not rank 0: rank 0 reports
        elif args.executor == "local":
            results = run_local(ready)
        else:
            results = launch_local(ready)
    except ValueError:  # a bad input: one line from the command line's own handler, and
        opened.undo()   # nothing left of this run
        raise
    except (Exception, KeyboardInterrupt) as error:  # one line, the trace in a log, and the
        return train_failure.report(args, job, error, first_step)  # outputs of what ran
    summary = summarize(results, schedule=job.plan.schedule, steps=job.steps,
                        batch_size=args.batch_size, microbatches=job.plan.microbatches,
                        pipelines=job.plan.pipelines, first_step=first_step,
                        advance=train_avgpipe.fixed_advance(job),
                        memory_limit=setup.memory_limit, precision=job.precision)
    summary = replace(summary, eval_losses=held_out(job, results))
    write_outputs(args.output_dir, job, summary, results, tensorboard=args.tensorboard)
    print(format_summary(summary, args.output_dir))
    if job.checkpoint is not None and job.checkpoint.directory is not None:
        print(f"checkpoints in {job.checkpoint.directory}/ (continue with --resume "
              f"{job.checkpoint.directory} --steps N)")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    return 0


def _mib(counted: int) -> str:
    """Counted bytes in MiB; "-" where nothing was counted (AvgPipe's online advance counts
    per window, see its log)."""
    return f"{counted / 2**20:.2f}" if counted else "-"


def format_summary(summary: TrainSummary, directory: Path) -> str:
    lines = [
        f"schedule {summary.schedule}  ranks {summary.world_size}  steps {summary.steps}  "
        f"batch {summary.batch_size}  micro-batches {summary.microbatches}",
        f"{'samples/s':>24}  {summary.samples_per_second:.1f}",
        f"{'final loss':>24}  {summary.final_loss:.4f}",
        f"{'measured bubble fraction':>24}  {summary.bubble_fraction:.3f}",
        f"{'wall time (s)':>24}  {summary.wall_seconds:.2f}",
        f"{'precision':>24}  {summary.precision}",
        f"{'rank':>6} {'peak memory (MiB)':>18} {'peak stashed micro-batches':>27} "
        f"{'activations (MiB)':>18} {'state (MiB)':>12}",
    ]
    counted = summary.peak_activation_bytes or [0] * len(summary.peak_memory_bytes)
    state = summary.state_bytes or [0] * len(summary.peak_memory_bytes)
    for rank, (memory, stashed, held, kept) in enumerate(zip(
            summary.peak_memory_bytes, summary.peak_stashed_microbatches, counted, state)):
        lines.append(f"{rank:>6} {memory / 2**20:>18.1f} {stashed:>27} {_mib(held):>18} "
                     f"{_mib(kept):>12}")
    if summary.eval_losses:
        step, loss = max(summary.eval_losses.items())
        lines.insert(3, f"{'held-out loss':>24}  {loss:.4f} (step {step})")
    lines.extend(train_avgpipe.summary_lines(summary))
    lines.append(f"outputs in {directory}/ (metrics.jsonl, metrics.csv, summary.json, trace.json, loss.png)")
    return "\n".join(lines)
