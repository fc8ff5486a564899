"""The asynchronous checkpoint writer of one rank.

At a checkpoint the rank only records references to its tensors (:meth:`CheckpointWriter._capture`)
and hands them to a thread that first makes a staging copy and then serialises, hashes and
``fsync``s it (:func:`~.store.write_shard`, :func:`~.store.finalize`). A fence right before the
rank's next optimizer step waits until the staging copy is done (see :mod:`.recovery`).
A stage sharded over ``dp`` or split over ``tp`` gathers its whole tensors on the training
thread instead (a collective of its ranks, :func:`_whole`): they are new tensors, which the
live ones' next update does not change.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...ir import Op, Schedule
from ...models.naming import global_name, global_names
from .boundaries import combine_hooks
from ..communication.sharded import full_value
from .export import model_record
from .resume import Session, optimizer_hyper
from .store import FORMAT, finalize, step_folder, write_shard
from ..job import Job
from ..execution.parts import RankParts
from ..execution.stage import StageRuntime

if TYPE_CHECKING:
    from ..execution.two_step import TwoStep

__all__ = ["CheckpointWriter", "MAX_PENDING_WRITES"]

MAX_PENDING_WRITES = 2
"""Checkpoints written or waiting to be written per rank (each holds a staging copy); a
checkpoint requested while this many are pending waits for the oldest (the disk is slower
than the checkpoint rate: memory, not time, would otherwise grow)."""


def _staged(value: Any) -> Any:
    """A copy of ``value`` with every tensor cloned (dicts, lists and tuples walked)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _staged(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_staged(item) for item in value)
    return value


class CheckpointWriter:
    """Writes one rank's checkpoints after the steps ``options`` asks for, off the training
    thread; :attr:`hooks` (position -> callable) are what the interpreter runs."""

    def __init__(self, *, job: Job, schedule: Schedule, rank: int, parts: RankParts,
                 device: torch.device, session: Session, cuts: Mapping[int, int],
                 steps_done: int, writes: bool = True) -> None:
        """``cuts``: the rank's iteration boundaries; ``steps_done``: where the run starts;
        ``writes`` False: a process of a tensor-parallel group other than its first, which
        takes part in the gathers of split tensors but writes nothing (the first writes the
        pipeline rank's shard)."""
        assert job.checkpoint is not None and job.checkpoint.directory is not None
        self.job = job
        self.directory = job.checkpoint.directory
        self.schedule = schedule
        self.rank = rank
        self.parts = parts
        self.device = device
        self.session = session
        self.writes = writes
        self.stream: dict[str, Any] | None = None
        """The data stream's description (without its position), recorded in the manifest."""
        self.stall_s = 0.0
        """Seconds the training thread spent on checkpoints (capture and fences)."""
        self.write_s: list[float] = []
        """Seconds each checkpoint took in the writer thread (serialise, fsync, manifest)."""
        self._cuts = cuts
        self._pool: ThreadPoolExecutor | None = None
        """Writes (serialise, hash, fsync, manifest), one at a time, in checkpoint order."""
        self._stager: ThreadPoolExecutor | None = None
        """Staging copies, never queued behind the disk."""
        self._write_failed = False
        self._futures: list[Future[None]] = []
        self._serialized: threading.Event | None = None
        self.hooks = self._writing_hooks(steps_done)

    def _writing_hooks(self, steps_done: int) -> dict[int, Callable[[], None]]:
        options = self.job.checkpoint
        assert options is not None
        program = self.schedule.programs[self.rank]
        updates = [p for p, a in enumerate(program) if a.op is Op.STEP]
        writes: dict[int, Callable[[], None]] = {}
        fences: dict[int, Callable[[], None]] = {}
        total = self.schedule.iterations
        for k in range(steps_done, total):
            if not options.writes_after(k + 1, total):
                continue
            cut = self._cuts[k]
            writes[cut - 1] = _bind(self._checkpoint, k + 1)
            following = next((p for p in updates if p >= cut), None)
            if following is not None:  # the next update changes the tensors being written
                fences[following - 1] = self._fence
        return combine_hooks(fences, writes)  # at one position: fence first, then write

    def window_hooks(self, program: Schedule) -> dict[int, Callable[[], None]]:
        """The fence of a window's ``program`` (AvgPipe's online advance runs the steps as
        programs of their own, :mod:`..advance.online`): right before its first update, which
        changes the tensors a checkpoint at the window's start is copying."""
        actions = program.programs[self.rank]
        first = next((p for p, a in enumerate(actions) if a.op is Op.STEP), None)
        return {} if not first else {first - 1: self._fence}

    def checkpoint_window(self, steps_done: int, advance: dict[str, Any]) -> None:
        """The checkpoint after ``steps_done`` steps, taken between two windows of the online
        advance controller, with its state ``advance`` (in the manifest: every rank's is the
        same)."""
        options = self.job.checkpoint
        assert options is not None
        if options.writes_after(steps_done, self.job.steps):
            self._checkpoint(steps_done, advance)

    def _checkpoint(self, steps_done: int, advance: dict[str, Any] | None = None) -> None:
        began = time.perf_counter()
        self._fence()
        while len(self._futures) >= MAX_PENDING_WRITES:  # the disk is behind: back-pressure
            self._futures[0].result()
            self._raise_failed()
        payload, record = self._capture(steps_done)
        if not self.writes:  # the group's first process writes what all gathered
            self.stall_s += time.perf_counter() - began
            return
        if advance is not None:
            record["common"]["advance"] = advance
        folder = step_folder(self.directory, steps_done, self.session.run_id)
        if self._pool is None or self._stager is None:
            self._stager = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-stage{self.rank}")
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-rank{self.rank}")
        serialized = threading.Event()
        staged = self._stager.submit(self._stage, payload, serialized)
        self._futures.append(self._pool.submit(self._write, folder, staged, record))
        self._serialized = serialized
        self.stall_s += time.perf_counter() - began

    @staticmethod
    def _stage(payload: dict[str, Any], serialized: threading.Event) -> dict[str, Any]:
        """The staging copy; from ``serialized`` on the live tensors are free to change."""
        try:
            return _staged(payload)
        finally:
            serialized.set()

    def _write(self, folder: Path, staged: Future[dict[str, Any]], record: dict[str, Any]) -> None:
        if self._write_failed:  # the run is failing: write nothing after a failed checkpoint
            return
        began = time.perf_counter()
        try:
            write_shard(folder, self.rank, staged.result(), record)
            finalize(folder, self.schedule.num_ranks)
        except BaseException:
            self._write_failed = True
            raise
        self.write_s.append(time.perf_counter() - began)

    def _fence(self) -> None:
        """Wait until the last write has staged its copy of the live tensors; raise writers'
        errors."""
        began = time.perf_counter()
        if self._serialized is not None:
            self._serialized.wait()
            self._serialized = None
        self._raise_failed()
        self.stall_s += time.perf_counter() - began

    def _raise_failed(self) -> None:
        done = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        for future in done:
            future.result()

    def _capture(self, steps_done: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """References to this rank's state (no copies; see the module docstring)."""
        layout = self.schedule.layout
        pipelines = [self.parts.pipeline(p) for p in range(self.schedule.pipelines)]
        parameters: list[dict[str, Tensor]] = [{} for _ in pipelines]
        optimizer_state: list[dict[str, dict[str, Any]]] = [{} for _ in pipelines]
        reference: dict[str, Tensor] = {}
        blocks: set[int] = set()
        tied_firsts = set(self.parts.tied_to.values())
        copies: list[dict[str, str]] = [{} for _ in pipelines]
        """sha256 of every use of a tied parameter held here: finalize checks they agree."""
        for stage_id, stage in self.parts.stages.items():
            for pipeline in pipelines:
                weights = pipeline.weights[stage_id]
                assert not weights.snapshots and not weights.predicted, "no version at a boundary"
            averager = self.parts.averagers.get(stage_id)
            assert averager is None or averager.between_iterations, "averaging at a boundary"
            first = layout.stage_ranks[stage_id][0] == self.rank
            if not first and stage.sharding is None:
                continue  # another replica writes this stage (a sharded one: all gather)
            if first:
                blocks.update(range(*stage.block_range))
            for index, pipeline in enumerate(pipelines):
                module = pipeline.stages[stage_id].module
                layouts = _layouts(pipeline.stages[stage_id])
                optimizer = pipeline.optimizers[stage_id]
                for name, param in global_names(module.named_parameters(),
                                                stage.block_range[0]):
                    if name in self.parts.tied_to or name in tied_firsts:
                        copies[index][name] = _digest(param)
                    if name in self.parts.tied_to:
                        continue  # a copy of a tied parameter: stored once, by its first use
                    whole, state = _whole(param, optimizer.state.get(param),
                                          layouts.get(id(param)))
                    if first:
                        parameters[index][name] = whole
                        if state:
                            optimizer_state[index][name] = state
            if averager is not None:  # replaced, never changed in place: no copy needed either
                for local, tensor in averager.reference_parameters().items():
                    reference[global_name(local, stage.block_range[0])] = tensor.detach()
        losses = [_loss_table({j: v for stage in pipeline.stages.values() if stage.is_last
                               for j, v in stage.losses.items()}) for pipeline in pipelines]
        rng: dict[str, Tensor | None] = {"cpu": torch.get_rng_state(), "cuda": None}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        payload: dict[str, Any] = {
            "format": FORMAT, "step": steps_done, "rank": self.rank, "parameters": parameters[0],
            "optimizer": optimizer_state[0], "rng": rng, "losses": losses[0],
        }
        if self.parts.averagers:  # AvgPipe: pipelines 1..N-1 and the reference model
            payload["pipelines"] = {
                str(index): {"parameters": parameters[index], "optimizer": optimizer_state[index],
                             "losses": losses[index]}
                for index in range(1, len(pipelines))}
            payload["reference"] = reference
        record = self._record(steps_done, blocks, parameters[0], losses[0], copies)
        return payload, record

    def _record(self, steps_done: int, blocks: set[int], parameters: Mapping[str, Tensor],
                losses: Mapping[str, Tensor], copies: list[dict[str, str]]) -> dict[str, Any]:
        """This rank's record of its shard (what ``finalize`` joins into the manifest):
        the blocks and parameters it holds, the tied copies' digests, and what every rank
        of the run must agree on (``common``)."""
        optimizer = next(iter(self.parts.optimizers.values()))
        return {
            "run_id": self.session.run_id, "step": steps_done, "blocks": sorted(blocks),
            "has_losses": bool(losses["microbatch"].numel()),
            "parameters": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                           for n, t in parameters.items()},
            "tied": [{name: {"of": self.parts.tied_to.get(name, name), "sha256": digest}
                      for name, digest in held.items()} for held in copies],
            "common": {
                "plan": self.job.plan.to_json(), "schedule": self.schedule.name,
                "model": model_record(self.job.model),
                "seed": self.job.seed, "steps_total": self.job.steps,
                "optimizer": {"type": type(optimizer).__name__, "hyper": optimizer_hyper(optimizer)},
                "data": {"batches_done": steps_done * self.job.plan.pipelines,
                         "stream": self.stream},
            },
        }

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for the pending checkpoints to be on disk (and complete); raise a writer's
        error (unless ``raise_errors`` is False: the run is failing already)."""
        if self._pool is None:
            return
        assert self._stager is not None
        self._stager.shutdown(wait=True, cancel_futures=not raise_errors)
        self._pool.shutdown(wait=True, cancel_futures=not raise_errors)
        self._pool = self._stager = None
        if raise_errors:
            self._raise_failed()
        else:
            self._futures = []


def _layouts(stage: StageRuntime) -> Mapping[int, TwoStep]:
    """The two-step layouts of a stage sharded over ``dp`` on top of ``tp`` (else none)."""
    return stage.sharding.layouts if stage.sharding is not None else {}


def _whole(param: Tensor, state: Mapping[str, Any] | None, layout: TwoStep | None = None
           ) -> tuple[Tensor, dict[str, Any] | None]:
    """A parameter and its optimizer state as whole tensors, so the checkpoint is the one an
    unsharded run writes and loads into any mesh: references to plain tensors (the writer
    copies them later), new gathered ones for a stage sharded over ``dp`` (FSDP2) or split
    over ``tp`` (a collective every process of the group calls in the same order: parameters
    in ``named_parameters`` order, each with its state in the optimizer's key order);
    ``layout``: both at once (:mod:`..execution.two_step`)."""
    def whole(tensor: Tensor) -> Tensor:
        tensor = tensor.detach()
        if layout is not None and tensor.shape == param.shape:
            from ..execution.two_step import two_step_whole  # FSDP2 only where sharded

            return two_step_whole(tensor, layout)
        return full_value(tensor)
    saved = None if not state else {
        k: whole(v) if isinstance(v, Tensor) else v for k, v in state.items()}
    return whole(param), saved


def _digest(param: Tensor) -> str:
    """sha256 of a parameter's bytes (copies of a tied parameter must be equal bit for bit)."""
    flat = param.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def _bind(function: Callable[[int], None], value: int) -> Callable[[], None]:
    return lambda: function(value)


def _loss_table(losses: Mapping[int, float]) -> dict[str, Tensor]:
    """Micro-batch losses as two tensors (what ``weights_only`` loading accepts)."""
    order = sorted(losses)
    return {"microbatch": torch.tensor(order, dtype=torch.int64),
            "value": torch.tensor([losses[j] for j in order], dtype=torch.float64)}
