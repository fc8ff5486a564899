"""When ``pipeweave train`` stops early: one line on screen, the traceback in a log file, and
the outputs of the steps that did complete.

A rank that fails (a diverging loss, a bad checkpoint shard, a lost peer) or a Ctrl-C reaches
the user as ``pipeweave: error: rank R: <cause> (traceback in <folder>/error.log)``; with
``--debug`` the traceback is printed as well. What the ranks had recorded before they stopped
(:func:`pipeweave.runtime.execution.parts.partial_results`) becomes ``metrics.jsonl``/``.csv``,
``trace.json``, ``loss.png`` and ``summary.json`` for the steps whose micro-batches all
finished, with ``"status": "failed"`` or ``"interrupted"`` in the summary; where a complete
checkpoint exists, the command says how to resume from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from ..runtime import Job
from ..runtime.checkpoint.store import complete_checkpoints, verified_checkpoints
from ..runtime.launch.interrupts import ctrl_c_deferred
from ..runtime.launch.processes import RunFailed, RunInterrupted, under_torchrun
from ..runtime.observation.summary import TrainSummary, summarize
from ..runtime.observation.results import RankResult, partial_results
from .main import INTERRUPTED
from .train_outputs import write_outputs

__all__ = ["report", "write_error_log", "completed_steps"]


def report(args: argparse.Namespace, job: Job, error: BaseException, first_step: int) -> int:
    """Tell the user why the run stopped, keep what it did; the exit status (1, 130). A
    second Ctrl-C meanwhile does not cut the outputs short."""
    with ctrl_c_deferred(replay=False):
        return _report(args, job, error, first_step)


def _report(args: argparse.Namespace, job: Job, error: BaseException, first_step: int) -> int:
    interrupted = isinstance(error, (KeyboardInterrupt, RunInterrupted))
    if isinstance(error, RunFailed):
        where = f"rank {error.rank}: " if error.rank is not None else ""
        cause, trace = error.cause, error.trace or traceback.format_exc()
    else:
        rank = os.environ.get("RANK") if under_torchrun() else None
        where = f"rank {rank}: " if rank is not None else ""
        cause = " ".join(str(error).split()) or type(error).__name__
        cause = "interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else cause
        trace = traceback.format_exc()
    name = "error.log" if not under_torchrun() else f"error-rank{os.environ['RANK']}.log"
    log = write_error_log(args.output_dir, name, trace)
    if args.debug:
        print(trace, file=sys.stderr)
    what = "traceback" if "Traceback" in trace else "details"  # a killed rank has none
    print(f"pipeweave: error: {where}{cause} ({what} in {log}"
          f"{'' if args.debug else '; --debug prints it'})", file=sys.stderr)
    if not (under_torchrun() and os.environ.get("RANK") != "0"):
        done = _write_partial(args, job, partial_results(error), first_step,
                              "interrupted" if interrupted else "failed", f"{where}{cause}")
        if done:
            print(f"kept the {done} completed step{'s' if done != 1 else ''} in "
                  f"{args.output_dir}/ (summary.json says "
                  f"{'interrupted' if interrupted else 'failed'})", file=sys.stderr)
        _resume_hint(job)
    return INTERRUPTED if interrupted else 1


def write_error_log(directory: Path, name: str, trace: str) -> Path:
    """Write ``trace`` to ``directory/name``, or to the temporary folder if ``directory``
    cannot be written; return where it went."""
    for folder in (directory, Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(trace)
            return path
        except OSError:
            continue
    return Path(os.devnull)


def completed_steps(results: list[RankResult], microbatches: int, first_step: int,
                    pipelines: int = 1) -> int:
    """Steps every micro-batch of which reached the loss, counted from ``first_step`` (steps
    restored from a checkpoint are complete) and stopping at the first incomplete one."""
    seen = {j for result in results for j in result.losses}
    for index in range(1, pipelines):
        seen &= {j for result in results for j in result.pipeline_losses.get(index, {})}
    step = first_step
    while all(j in seen for j in range(step * microbatches, (step + 1) * microbatches)):
        step += 1
    return step


def _write_partial(args: argparse.Namespace, job: Job, results: list[RankResult],
                   first_step: int, status: str, error: str) -> int:
    done = completed_steps(results, job.plan.microbatches, first_step, job.plan.pipelines)
    directory = args.output_dir
    if done == 0 or not results:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "summary.json").write_text(json.dumps(
            {"schedule": job.plan.schedule, "steps": 0, "status": status, "error": error},
            indent=2) + "\n")
        return 0
    summary = summarize(results, schedule=job.plan.schedule, steps=done,
                        batch_size=args.batch_size, microbatches=job.plan.microbatches,
                        pipelines=job.plan.pipelines, first_step=first_step,
                        precision=job.precision)
    losses = summary.losses[:done]
    summary = dataclasses.replace(summary, losses=losses, final_loss=losses[-1],
                                  status=status, error=error)
    write_outputs(directory, job, summary, results, tensorboard=args.tensorboard)
    return done


def _resume_hint(job: Job) -> None:
    """Name the newest checkpoint that verifies (checksums checked): the folder when
    ``--resume`` of the folder would take it, else that checkpoint itself."""
    folder = job.checkpoint.directory if job.checkpoint is not None else None
    if folder is None:
        return
    verified = verified_checkpoints(folder, limit=1)
    if not verified:
        return
    target = folder if verified[0] == complete_checkpoints(folder)[-1] else verified[0]
    print(f"continue from the last complete checkpoint with --resume {target} "
          f"--steps {job.steps}", file=sys.stderr)
