"""What a run resumes from, and whether it fits: checked before any rank starts.

:func:`check_resume` resolves ``--resume`` (a folder, or ``auto``: the latest complete
checkpoint), opens it (checksums verified) and refuses one written for another model, optimizer,
data stream or number of parallel pipelines, naming the fix. A :class:`Session` is what all
ranks of one run agree on: its id and the folder it resumes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...models import ModelSpec
from ...precision import parameter_dtype
from .options import AUTO, CheckpointOptions
from .store import CheckpointError, StoredCheckpoint, find_resume, resolve
from ..job import Job

__all__ = ["Session", "resume_folder", "new_session", "model_parameters",
           "check_resume", "check_optimizer", "check_stream", "check_pipelines",
           "optimizer_hyper"]

@dataclass(frozen=True)
class Session:
    """What all ranks of one run agree on: the run's id (in its checkpoint folders' names) and
    the checkpoint folder it resumes from (None: from step 0)."""

    run_id: str
    resume_from: str | None


def resume_folder(options: CheckpointOptions | None) -> str | None:
    if options is None or options.resume is None:
        return None
    if options.resume == AUTO:
        assert options.directory is not None
        found = find_resume(options.directory)
        return None if found is None else str(found)
    return str(resolve(options.resume))


def new_session(options: CheckpointOptions | None,
                resume: StoredCheckpoint | None | str = "resolve") -> Session:
    """A fresh run id; the checkpoint to resume (``"resolve"``: look it up from ``options``)."""
    if isinstance(resume, str):
        return Session(uuid.uuid4().hex[:8], resume_folder(options))
    return Session(uuid.uuid4().hex[:8], None if resume is None else str(resume.folder))


def model_parameters(spec: ModelSpec, precision: str = "full") -> dict[str, tuple[list[int], str]]:
    """``"<block>.<name>" -> (shape, dtype)`` for every parameter of the model as the stages
    hold it in ``precision`` (:func:`pipeweave.precision.parameter_dtype`); a parameter
    several blocks share (``spec.tied``, kept in one stage) once, under its first block's name,
    as its stage names and stores it."""
    later = {name for group in spec.tied for name in group[1:]}

    def dtype(p: nn.Parameter) -> str:
        stored = parameter_dtype(precision, p.dtype) if p.is_floating_point() else p.dtype
        return str(stored).removeprefix("torch.")

    return {f"{index}.{name}": (list(p.shape), dtype(p))
            for index, block in enumerate(spec.blocks) for name, p in block.named_parameters()
            if f"{index}.{name}" not in later}


def check_resume(job: Job, spec: ModelSpec, *, verify: bool = True) -> StoredCheckpoint | None:
    """Before any rank starts: resolve what ``job`` resumes from, check that it fits this model
    and run, and (``verify``) every shard's sha256; None when not resuming."""
    folder = resume_folder(job.checkpoint)
    if folder is None:
        return None
    stored = StoredCheckpoint(folder, verify=verify)
    _check_fits(stored, model_parameters(spec, job.precision), job)
    # What the ranks would find only after starting: the optimizer's type (built here on a
    # stand-in parameter) and the data stream's description.
    check_optimizer(stored, type(job.optimizer([nn.Parameter(torch.zeros(1))])).__name__)
    stream = job.data()
    state = getattr(stream, "state_dict", None)
    if callable(state) and callable(getattr(stream, "load_state_dict", None)):
        check_stream(stored, {k: v for k, v in dict(state()).items() if k != "position"})
    return stored


def check_optimizer(stored: StoredCheckpoint, optimizer_type: str) -> None:
    saved = stored.manifest["optimizer"]["type"]
    if saved != optimizer_type:
        raise CheckpointError(f"checkpoint {stored.folder} was written with optimizer {saved}; "
                              f"this run uses {optimizer_type}; resume with the same optimizer")


def check_stream(stored: StoredCheckpoint, stream: Mapping[str, Any]) -> None:
    saved = stored.manifest["data"]["stream"]
    if saved is not None and saved != dict(stream):
        raise CheckpointError(
            f"checkpoint {stored.folder} was written with the data stream {saved} but this run "
            f"reads {dict(stream)}; resume with the same dataset, batch size, sequence length "
            f"and seed")


def _check_fits(stored: StoredCheckpoint, expected: Mapping[str, tuple[list[int], str]],
                job: Job) -> None:
    check_pipelines(stored, job.plan.pipelines)
    saved = stored.manifest["parameters"]
    missing = sorted(set(expected) - set(saved), key=_block_order)
    extra = sorted(set(saved) - set(expected), key=_block_order)
    if missing or extra:
        detail = (f"it lacks {missing[:3]}" if missing else "") + (
            ("; " if missing and extra else "") + f"it has {extra[:3]} which this model lacks"
            if extra else "")
        raise CheckpointError(f"checkpoint {stored.folder} was written for another model "
                              f"({stored.manifest['plan']['num_blocks']} blocks; this one has "
                              f"{job.plan.num_blocks}): {detail}")
    for name, (shape, dtype) in expected.items():
        if saved[name]["shape"] != shape or saved[name]["dtype"] != dtype:
            raise CheckpointError(
                f"checkpoint {stored.folder} was written for another model: parameter {name} is "
                f"{saved[name]['dtype']}{saved[name]['shape']} there but {dtype}{shape} here")
    if stored.step >= job.steps:
        raise CheckpointError(f"checkpoint {stored.folder} is at step {stored.step} and the run "
                              f"has {job.steps} steps: nothing is left to run; raise --steps")


def check_pipelines(stored: StoredCheckpoint, pipelines: int) -> None:
    """AvgPipe: the checkpoint holds one model and optimizer state per parallel pipeline, so
    their number N must match (no exact way to make N' models out of N)."""
    saved = int(stored.manifest["plan"].get("pipelines", 1))
    if saved != pipelines:
        raise CheckpointError(
            f"checkpoint {stored.folder} was written with {saved} parallel pipeline"
            f"{'s' if saved != 1 else ''} (AvgPipe's N={saved}: a model and optimizer state per "
            f"pipeline, and their reference model) but this run has N={pipelines}; there is no "
            f"exact way to continue N={saved} pipelines as N={pipelines}. Resume with "
            f"--pipelines {saved} (Plan.pipelines={saved}), or start a new run without --resume")


def _block_order(name: str) -> tuple[int, str]:
    block, _, rest = name.partition(".")
    return (int(block) if block.isdigit() else -1, rest)


def optimizer_hyper(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's hyper-parameters per group, as JSON values."""
    def plain(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value.item()
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
    return [{k: plain(v) for k, v in group.items() if k != "params"}
            for group in optimizer.param_groups]
