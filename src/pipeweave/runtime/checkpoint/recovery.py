"""Checkpoint and resume at iteration boundaries, keyed by block so any plan can resume.

**Where a checkpoint is taken.** The schedule is one program per rank for the whole run. The
checkpoint "after step ``k``" is, on each rank, the point of its program after which no
action of iterations ``< k`` remains and before which no action of iteration ``k`` ran
(:func:`iteration_boundaries`). For the synchronous (flush) schedules that is right after the
rank's updates of iteration ``k - 1``::

    rank 0:  F0 F1 B0 B1 U@1 | F2 F3 B2 B3 U@2 |        | = checkpoint after step 1, 2
    rank 1:  F0 B0 F1 B1 U@1 | F2 B2 F3 B3 U@2 |

No micro-batch is in flight there and every stage holds exactly one weight version, so the
state is: parameters, optimizer state, RNG, losses so far and the step count; data position
is the step count (batch ``k`` of a resumable stream depends only on ``k``). PipeDream
(pipedream.txt §4, "Checkpointing") takes such checkpoints per stage with no global
coordination; each rank here also writes on its own (:mod:`.checkpoint_store` proves
completeness with a manifest written last).

**AvgPipe** (``avgpipe``, N parallel pipelines) flushes every iteration too, and each rank
runs all N pipelines' updates and averaging steps (``U@k AV@k U@k#1 AV@k#1 ...``) before the
next iteration's first forward. There every stage's
:class:`~pipeweave.runtime.averaging.elastic.ElasticAverager` is between iterations (nothing held but
the reference model), so a shard adds, per block: pipelines 1..N-1's parameters, optimizer
state and losses (``pipelines["<p>"]``; pipeline 0's stay at the top level as for every
schedule) and the ``reference`` model. The data position is ``N`` batches per step. N must
match on resume (:func:`_check_pipelines`).

Asynchronous schedules (PipeDream, 2BW, PipeOptim, SpecTrain, WPipe) have no such point:
micro-batches of iteration ``k`` are still in flight, with stashed activations and weight
versions, when iteration ``k + 1`` starts. Saving that would mean serialising autograd
graphs (or in-flight inputs, stashed versions and messages in transit), so they are
rejected with a clear error (see docs/checkpoints.md).

**Keyed by block.** Parameters and optimizer state are stored under ``"<block>.<name>"``
(the names :class:`~pipeweave.runtime.execution.parts.RankResult` uses), written by the first replica
of each stage. A resumed run finds each of its blocks wherever it was, so the stage count,
split, chunks and replicas may all change between checkpoint and resume.

**No copy on the critical path.** At the checkpoint the rank only records references to its
tensors and hands them to a writer thread. The writer first copies them (a staging copy in
memory: parameters, optimizer state, reference models, on a thread of its own so it never
queues behind the disk) and then serialises, hashes and ``fsync``s the copy. The live tensors change next at the rank's next optimizer step, so a
fence right before that step waits until the staging copy is done — normally long done, as
the writer had a whole iteration of compute; at worst the training thread waits for one copy
of the checkpointed state, never for serialisation or the disk.

**Resume.** A resumed rank starts its program at the checkpoint's position, with the same
global micro-batch numbers and version counters as the uninterrupted run, so it does exactly
the same operations on the same data: losses and parameters are bit-identical (same plan,
or any plan with the same micro-batch count and data-parallel width).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ...ir import Action, Op, Schedule
from ...models import ModelSpec
from .options import AUTO, CheckpointOptions
from .store import (FORMAT, CheckpointError, StoredCheckpoint, find_resume, finalize,
                               resolve, step_folder, write_shard)
from ..job import Job
from ..execution.parts import RankParts

__all__ = ["iteration_boundaries", "check_checkpointable", "check_resume", "Session",
           "new_session", "agreed_session", "RankRecovery", "distributed_recovery", "Hooks",
           "combine_hooks", "model_parameters", "CheckpointError"]

Hooks = Mapping[int, Callable[[], None]]
"""``position -> callable`` run right after the action at ``position`` of a rank's program."""


def combine_hooks(*maps: Hooks) -> dict[int, Callable[[], None]]:
    """One hook map; hooks at the same position run in the order the maps are given."""
    lists: dict[int, list[Callable[[], None]]] = {}
    for hooks in maps:
        for position, hook in hooks.items():
            lists.setdefault(position, []).append(hook)
    return {p: (fs[0] if len(fs) == 1 else _chain(fs)) for p, fs in lists.items()}


def _chain(hooks: list[Callable[[], None]]) -> Callable[[], None]:
    def run_all() -> None:
        for hook in hooks:
            hook()
    return run_all


# -- where checkpoints can be taken ------------------------------------------------------------
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


def _iteration_of(action: Action, microbatches: int) -> int:
    if action.microbatch is not None:
        return action.microbatch // microbatches
    if action.op in (Op.STEP, Op.ALL_REDUCE, Op.AVERAGE) and action.version is not None:
        return action.version - 1  # a flush schedule's update (and AV) k+1 ends iteration k
    raise ValueError(f"{action}: cannot tell which iteration it belongs to")


def iteration_boundaries(schedule: Schedule, rank: int) -> list[int]:
    """``cut[k]``: how many leading actions of ``rank``'s program belong to iterations ``<= k``.

    Raises ValueError when some action of a later iteration comes before the end of an
    earlier one (no clean boundary: an asynchronous schedule).
    """
    program = schedule.programs[rank]
    iterations = schedule.iterations
    last = [-1] * iterations
    first = [len(program)] * iterations
    for position, action in enumerate(program):
        k = _iteration_of(action, schedule.microbatches)
        if not 0 <= k < iterations:
            raise ValueError(f"schedule {schedule.name!r}: {action} on rank {rank} is not part of "
                             f"one of its {iterations} iterations the way a flush schedule's "
                             f"update is; there are no checkpoint boundaries")
        last[k] = max(last[k], position)
        first[k] = min(first[k], position)
    cuts, done = [], -1
    for k in range(iterations):
        done = max(done, last[k])
        cuts.append(done + 1)
    later = len(program)  # earliest position of any iteration > k
    for k in range(iterations - 2, -1, -1):
        later = min(later, first[k + 1])
        if later < cuts[k]:
            raise ValueError(
                f"schedule {schedule.name!r}: on rank {rank}, {program[later]} (iteration "
                f"{_iteration_of(program[later], schedule.microbatches)}) runs before iteration "
                f"{k} ends; there is no checkpoint boundary after step {k + 1}")
    return cuts


def check_checkpointable(job: Job, schedule: Schedule,
                         ranks: Iterable[int] | None = None) -> None:
    """Reject checkpoint/resume settings the schedule cannot honour, naming the fix.

    ``ranks``: whose programs to check for boundaries (default: all).
    """
    options = job.checkpoint
    if options is None or (options.directory is None and options.resume is None):
        return
    if not schedule.synchronous:
        raise ValueError(
            f"checkpoint/resume needs a synchronous schedule, and {schedule.name!r} is "
            f"asynchronous: when iteration k+1 starts, micro-batches of iteration k are still in "
            f"flight with stashed activations and weight versions, so no rank ever reaches a "
            f"point where it can stop and resume exactly. Use gpipe, 1f1b, interleaved-1f1b, "
            f"sliced-1f1b or avgpipe, or run without --checkpoint-dir/--checkpoint-every/--resume")
    if job.advance is not None:
        raise ValueError(
            f"checkpoint/resume with the online advance controller (--advance auto, Job.advance) "
            f"is not supported yet: it runs {schedule.name!r} one iteration at a time, as "
            f"schedules of their own, and checkpoints are positions in the whole run's "
            f"schedule. Fix the advance (--advance K, or --option advance=K), or run without "
            f"--checkpoint-dir/--checkpoint-every/--resume")
    ranks = range(schedule.num_ranks) if ranks is None else ranks
    for rank in ranks:
        iteration_boundaries(schedule, rank)


# -- what a run resumes from ----------------------------------------------------------------------
@dataclass(frozen=True)
class Session:
    """What all ranks of one run agree on: the run's id (in its checkpoint folders' names) and
    the checkpoint folder it resumes from (None: from step 0)."""

    run_id: str
    resume_from: str | None


def _resume_folder(options: CheckpointOptions | None) -> str | None:
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
        return Session(uuid.uuid4().hex[:8], _resume_folder(options))
    return Session(uuid.uuid4().hex[:8], None if resume is None else str(resume.folder))


def agreed_session(options: CheckpointOptions | None) -> Session:
    """Rank 0 decides the session and broadcasts it (torch.distributed is initialised), so
    that every rank uses the same id and resumes the same checkpoint; a resolution error is
    raised on every rank."""
    message: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            session = new_session(options)
            message = [(session.run_id, session.resume_from, None)]
        except CheckpointError as error:
            message = [("", None, str(error))]
    dist.broadcast_object_list(message, src=0)
    run_id, resume_from, problem = message[0]
    if problem is not None:
        raise CheckpointError(problem)
    return Session(run_id, resume_from)


def model_parameters(spec: ModelSpec) -> dict[str, tuple[list[int], str]]:
    """``"<block>.<name>" -> (shape, dtype)`` for every parameter of the model."""
    return {f"{index}.{name}": (list(p.shape), str(p.dtype).removeprefix("torch."))
            for index, block in enumerate(spec.blocks) for name, p in block.named_parameters()}


def check_resume(job: Job, spec: ModelSpec, *, verify: bool = True) -> StoredCheckpoint | None:
    """Before any rank starts: resolve what ``job`` resumes from, check that it fits this model
    and run, and (``verify``) every shard's sha256; None when not resuming."""
    folder = _resume_folder(job.checkpoint)
    if folder is None:
        return None
    stored = StoredCheckpoint(folder, verify=verify)
    _check_fits(stored, model_parameters(spec), job)
    # What the ranks would find only after starting: the optimizer's type (built here on a
    # stand-in parameter) and the data stream's description.
    _check_optimizer(stored, type(job.optimizer([nn.Parameter(torch.zeros(1))])).__name__)
    stream = job.data()
    state = getattr(stream, "state_dict", None)
    if callable(state) and callable(getattr(stream, "load_state_dict", None)):
        _check_stream(stored, {k: v for k, v in dict(state()).items() if k != "position"})
    return stored


def _check_optimizer(stored: StoredCheckpoint, optimizer_type: str) -> None:
    saved = stored.manifest["optimizer"]["type"]
    if saved != optimizer_type:
        raise CheckpointError(f"checkpoint {stored.folder} was written with optimizer {saved}; "
                              f"this run uses {optimizer_type}; resume with the same optimizer")


def _check_stream(stored: StoredCheckpoint, stream: Mapping[str, Any]) -> None:
    saved = stored.manifest["data"]["stream"]
    if saved is not None and saved != dict(stream):
        raise CheckpointError(
            f"checkpoint {stored.folder} was written with the data stream {saved} but this run "
            f"reads {dict(stream)}; resume with the same dataset, batch size, sequence length "
            f"and seed")


def _check_fits(stored: StoredCheckpoint, expected: Mapping[str, tuple[list[int], str]],
                job: Job) -> None:
    _check_pipelines(stored, job.plan.pipelines)
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


def _check_pipelines(stored: StoredCheckpoint, pipelines: int) -> None:
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


# -- one rank ----------------------------------------------------------------------------------------
class RankRecovery:
    """One rank's checkpoint writer and resume point (a no-op without ``job.checkpoint``).

    Use: build the rank's parts, then ``recovery = RankRecovery(...)`` (restores them when
    resuming), feed the data through :meth:`positioned` with ``first_batch``, start the
    interpreter at :attr:`start` with :attr:`hooks`, and :meth:`close` after the run.
    """

    def __init__(self, *, job: Job, schedule: Schedule, rank: int, parts: RankParts,
                 device: torch.device, session: Session | None, apply_rng: bool = True,
                 stored: StoredCheckpoint | None = None) -> None:
        """``stored``: the (verified) checkpoint ``session`` resumes, if already open."""
        self.job = job
        self.options = job.checkpoint
        self.schedule = schedule
        self.rank = rank
        self.parts = parts
        self.device = device
        self.session = session
        self.steps_done = 0
        """Steps already done when this run starts (the checkpoint's step)."""
        self.start = 0
        """Position in the rank's program to start at."""
        self.rng_state: Tensor | None = None
        """CPU RNG state to start from (None: the run's seed)."""
        self.stall_s = 0.0
        """Seconds the training thread spent on checkpoints (capture and fences)."""
        self.write_s: list[float] = []
        """Seconds each checkpoint took in the writer thread (serialise, fsync, manifest)."""
        self.hooks: dict[int, Callable[[], None]] = {}
        self._stored: StoredCheckpoint | None = None
        self._stream: dict[str, Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        """Writes (serialise, hash, fsync, manifest), one at a time, in checkpoint order."""
        self._stager: ThreadPoolExecutor | None = None
        """Staging copies, never queued behind the disk."""
        self._write_failed = False
        self._futures: list[Future[None]] = []
        self._serialized: threading.Event | None = None
        if self.options is None:
            return
        check_checkpointable(job, schedule, ranks=(rank,))
        self._cuts = iteration_boundaries(schedule, rank)
        if session is not None and session.resume_from is not None:
            if stored is None or str(stored.folder) != session.resume_from:
                stored = StoredCheckpoint(session.resume_from, verify=False)
            self._restore(stored, apply_rng)
        if self.options.directory is not None:
            self.hooks = self._writing_hooks()

    @property
    def first_batch(self) -> int:
        """Index of the first batch of the data stream this run reads."""
        return self.steps_done * self.job.plan.pipelines

    def positioned(self, stream: Iterable[Any]) -> Iterable[Any]:
        """``stream`` moved to :attr:`first_batch` (``load_state_dict`` when it has one)."""
        state = getattr(stream, "state_dict", None)
        if callable(state) and callable(getattr(stream, "load_state_dict", None)):
            current = dict(state())
            self._stream = {k: v for k, v in current.items() if k != "position"}
            if self._stored is not None:
                _check_stream(self._stored, self._stream)
            if self.first_batch:
                stream.load_state_dict({**current, "position": self.first_batch})  # type: ignore[attr-defined]
            return stream
        return itertools.islice(stream, self.first_batch, None) if self.first_batch else stream

    # -- resume --------------------------------------------------------------------------
    def _restore(self, stored: StoredCheckpoint, apply_rng: bool) -> None:
        self._stored = stored
        _check_pipelines(stored, self.job.plan.pipelines)
        expected = self._own_parameters()
        _check_fits_own(stored, expected)
        if stored.step >= self.job.steps:
            raise CheckpointError(f"checkpoint {stored.folder} is at step {stored.step} and the "
                                  f"run has {self.job.steps} steps: nothing is left to run; "
                                  f"raise --steps")
        here = next(iter(self.parts.optimizers.values()))
        _check_optimizer(stored, type(here).__name__)
        if stored.manifest["optimizer"]["hyper"] != _hyper(here) and self.rank == 0:
            warnings.warn(f"resuming with optimizer settings {_hyper(here)}; the checkpoint was "
                          f"written with {stored.manifest['optimizer']['hyper']}", stacklevel=2)
        self._warn_averaging_settings(stored)
        self.steps_done = stored.step
        self.start = self._cuts[stored.step - 1]
        shards: dict[str, dict[str, Any]] = {}

        def shard(name: str) -> dict[str, Any]:
            if name not in shards:
                shards[name] = stored.load(name)
            return shards[name]

        def part(name: str, pipeline: int) -> Mapping[str, Any]:
            """What the shard holding parameter ``name`` saved for ``pipeline``."""
            file = stored.file_of(name)
            return _pipeline_part(shard(file), pipeline, f"checkpoint {stored.folder}, {file}")

        program = self.schedule.programs[self.rank]
        for index in range(self.schedule.pipelines):
            pipeline = self.parts.pipeline(index)
            for stage_id, stage in pipeline.stages.items():
                names = _global_names(stage.module.named_parameters(), stage.block_range[0])
                with torch.no_grad():
                    for param, name in names.items():
                        param.copy_(part(name, index)["parameters"][name])
                optimizer = pipeline.optimizers[stage_id]
                state = optimizer.state_dict()
                params = [p for group in optimizer.param_groups for p in group["params"]]
                for position, param in enumerate(params):
                    saved = part(names[param], index)["optimizer"].get(names[param])
                    if saved:
                        state["state"][position] = {k: v.clone() if isinstance(v, Tensor) else v
                                                    for k, v in saved.items()}
                optimizer.load_state_dict(state)
                pipeline.weights[stage_id].live_version = sum(
                    1 for a in program[:self.start]
                    if a.op is Op.STEP and a.stage == stage_id and a.pipeline == index)
        for stage_id, averager in self.parts.averagers.items():
            first = self.parts.stages[stage_id].block_range[0]
            reference = {}
            for local in averager.reference_parameters():
                name = _global_name(local, first)
                saved = shard(stored.file_of(name)).get("reference")
                if saved is None and self.schedule.pipelines == 1:
                    # Written without averaging (e.g. by 1f1b): with one pipeline the reference
                    # *is* that pipeline's model at every iteration boundary (runtime/averaging/elastic.py).
                    saved = shard(stored.file_of(name))["parameters"]
                if saved is None or name not in saved:
                    raise CheckpointError(
                        f"checkpoint {stored.folder} holds no reference model for {name} "
                        f"({stored.file_of(name)}), which {self.schedule.name!r} with "
                        f"{self.schedule.pipelines} pipelines needs; it was not written by an "
                        f"averaging run. Resume it with the schedule it was written with "
                        f"({stored.manifest['schedule']!r})")
                reference[local] = saved[name]
            averager.load_reference(reference, stored.step)
        last = self.schedule.num_stages - 1
        if last in self.parts.stages and self.schedule.layout.stage_ranks[last][0] == self.rank:
            saved_m = int(stored.manifest["plan"]["microbatches"])
            for entry in stored.manifest["shards"]:
                if not entry["has_losses"]:
                    continue
                where = f"checkpoint {stored.folder}, {entry['file']}"
                for index in range(self.schedule.pipelines):
                    losses = _pipeline_part(shard(entry["file"]), index, where)["losses"]
                    history = self.parts.pipeline(index).stages[last].losses
                    saved = dict(zip(losses["microbatch"].tolist(), losses["value"].tolist()))
                    history.update(rekey_losses(saved, saved_m, self.schedule.microbatches))
        if self._same_layout(stored):
            rng = shard(f"rank{self.rank}.pt")["rng"]
            self.rng_state = rng["cpu"].clone()
            if self.device.type == "cuda" and rng.get("cuda") is not None:
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        else:  # another layout: no rank's stream of random numbers carries over
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.job.seed * 1_000_003 + stored.step)
                self.rng_state = torch.get_rng_state()
        if apply_rng:
            torch.set_rng_state(self.rng_state)

    def _warn_averaging_settings(self, stored: StoredCheckpoint) -> None:
        """Like the optimizer's hyper-parameters: the resumed run's alpha and order apply."""
        if not self.parts.averagers or self.rank != 0:
            return
        keys = ("alpha", "average_order")
        saved = {k: v for k, v in stored.manifest["plan"].get("semantics", {}).items() if k in keys}
        here = {k: v for k, v in self.job.plan.semantics.given().items() if k in keys}
        if saved != here:
            warnings.warn(f"resuming with averaging settings {here or 'defaults'}; the checkpoint "
                          f"was written with {saved or 'defaults'}", stacklevel=3)

    def _same_layout(self, stored: StoredCheckpoint) -> bool:
        saved, plan = stored.manifest["plan"], self.job.plan.to_json()
        keys = ("stages", "chunks", "replicas", "width", "pipelines")
        return (stored.manifest["world_size"] == self.schedule.num_ranks
                and all(saved[k] == plan[k] for k in keys))

    def _own_parameters(self) -> dict[str, tuple[list[int], str]]:
        own: dict[str, tuple[list[int], str]] = {}
        for stage in self.parts.stages.values():
            for param, name in _global_names(stage.module.named_parameters(),
                                             stage.block_range[0]).items():
                own[name] = (list(param.shape), str(param.dtype).removeprefix("torch."))
        return own

    # -- writing --------------------------------------------------------------------------
    def _writing_hooks(self) -> dict[int, Callable[[], None]]:
        assert self.options is not None
        program = self.schedule.programs[self.rank]
        updates = [p for p, a in enumerate(program) if a.op is Op.STEP]
        writes: dict[int, Callable[[], None]] = {}
        fences: dict[int, Callable[[], None]] = {}
        total = self.schedule.iterations
        for k in range(self.steps_done, total):
            if not self.options.writes_after(k + 1, total):
                continue
            cut = self._cuts[k]
            writes[cut - 1] = _bind(self._checkpoint, k + 1)
            following = next((p for p in updates if p >= cut), None)
            if following is not None:  # the next update changes the tensors being written
                fences[following - 1] = self._fence
        return combine_hooks(fences, writes)  # at one position: fence first, then write

    def _checkpoint(self, steps_done: int) -> None:
        began = time.perf_counter()
        self._fence()
        assert self.options is not None and self.options.directory is not None
        assert self.session is not None
        while len(self._futures) >= MAX_PENDING_WRITES:  # the disk is behind: back-pressure
            self._futures[0].result()
            self._raise_failed()
        payload, record = self._capture(steps_done)
        folder = step_folder(self.options.directory, steps_done, self.session.run_id)
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
        for stage_id, stage in self.parts.stages.items():
            for pipeline in pipelines:
                weights = pipeline.weights[stage_id]
                assert not weights.snapshots and not weights.predicted, "no version at a boundary"
            averager = self.parts.averagers.get(stage_id)
            assert averager is None or averager.between_iterations, "averaging at a boundary"
            if layout.stage_ranks[stage_id][0] != self.rank:
                continue  # another replica writes this stage
            blocks.update(range(*stage.block_range))
            for index, pipeline in enumerate(pipelines):
                module = pipeline.stages[stage_id].module
                optimizer = pipeline.optimizers[stage_id]
                for param, name in _global_names(module.named_parameters(),
                                                 stage.block_range[0]).items():
                    parameters[index][name] = param.detach()
                    state = optimizer.state.get(param)
                    if state:
                        optimizer_state[index][name] = {
                            k: v.detach() if isinstance(v, Tensor) else v for k, v in state.items()}
            if averager is not None:  # replaced, never changed in place: no copy needed either
                for local, tensor in averager.reference_parameters().items():
                    reference[_global_name(local, stage.block_range[0])] = tensor.detach()
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
        optimizer = next(iter(self.parts.optimizers.values()))
        assert self.session is not None
        record = {
            "run_id": self.session.run_id, "step": steps_done, "blocks": sorted(blocks),
            "has_losses": bool(losses[0]["microbatch"].numel()),
            "parameters": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                           for n, t in parameters[0].items()},
            "common": {
                "plan": self.job.plan.to_json(), "schedule": self.schedule.name,
                "seed": self.job.seed, "steps_total": self.job.steps,
                "optimizer": {"type": type(optimizer).__name__, "hyper": _hyper(optimizer)},
                "data": {"batches_done": steps_done * self.job.plan.pipelines,
                         "stream": self._stream},
            },
        }
        return payload, record

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


def _bind(function: Callable[[int], None], value: int) -> Callable[[], None]:
    return lambda: function(value)


def _global_name(local: str, first_block: int) -> str:
    """Stage-local name ``"<i>.<rest>"`` to global ``"<first_block + i>.<rest>"``."""
    index, _, rest = local.partition(".")
    return f"{first_block + int(index)}.{rest}"


def _global_names(named: Iterable[tuple[str, torch.nn.Parameter]],
                  first_block: int) -> dict[torch.nn.Parameter, str]:
    """Each parameter's global name (:func:`_global_name`)."""
    return {param: _global_name(name, first_block) for name, param in named}


def rekey_losses(losses: Mapping[int, float], saved_microbatches: int,
                 microbatches: int) -> dict[int, float]:
    """Micro-batch losses written under ``saved_microbatches`` per iteration, keyed for a run
    with ``microbatches``: a run reads a micro-batch ``j``'s loss as part of iteration
    ``j // M``, so after a change of M each restored iteration's total (the weighted losses of
    an iteration sum to the batch's mean loss) sits at its first micro-batch."""
    if saved_microbatches == microbatches:
        return dict(losses)
    totals: dict[int, float] = {}
    for microbatch, value in losses.items():
        iteration = microbatch // saved_microbatches
        totals[iteration] = totals.get(iteration, 0.0) + value
    return {iteration * microbatches: total for iteration, total in totals.items()}


def _loss_table(losses: Mapping[int, float]) -> dict[str, Tensor]:
    """Micro-batch losses as two tensors (what ``weights_only`` loading accepts)."""
    order = sorted(losses)
    return {"microbatch": torch.tensor(order, dtype=torch.int64),
            "value": torch.tensor([losses[j] for j in order], dtype=torch.float64)}


def _pipeline_part(data: Mapping[str, Any], pipeline: int, where: str) -> Mapping[str, Any]:
    """A shard's ``parameters``/``optimizer``/``losses`` of one AvgPipe pipeline: pipeline 0's
    at the top level (as for every schedule), the others' under ``pipelines["<p>"]``."""
    if pipeline == 0:
        return data
    try:
        return data["pipelines"][str(pipeline)]
    except KeyError:
        raise CheckpointError(f"{where} holds no state for parallel pipeline {pipeline} "
                              f"(damaged, or written by another version)") from None


def _check_fits_own(stored: StoredCheckpoint, own: Mapping[str, tuple[list[int], str]]) -> None:
    saved = stored.manifest["parameters"]
    for name, (shape, dtype) in own.items():
        if name not in saved:
            raise CheckpointError(f"checkpoint {stored.folder} was written for another model: it "
                                  f"has no parameter {name}")
        if saved[name]["shape"] != shape or saved[name]["dtype"] != dtype:
            raise CheckpointError(
                f"checkpoint {stored.folder} was written for another model: parameter {name} is "
                f"{saved[name]['dtype']}{saved[name]['shape']} there but {dtype}{shape} here")


def _hyper(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's hyper-parameters per group, as JSON values."""
    def plain(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value.item()
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
    return [{k: plain(v) for k, v in group.items() if k != "params"}
            for group in optimizer.param_groups]


def distributed_recovery(job: Job, schedule: Schedule, rank: int, parts: RankParts,
                         device: torch.device) -> RankRecovery:
    """:class:`RankRecovery` for a rank of a distributed run (the session agreed via rank 0)."""
    session = agreed_session(job.checkpoint) if job.checkpoint is not None else None
    return RankRecovery(job=job, schedule=schedule, rank=rank, parts=parts, device=device,
                        session=session)
