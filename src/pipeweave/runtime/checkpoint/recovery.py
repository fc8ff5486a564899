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
coordination; each rank here also writes on its own (:mod:`.store` proves
completeness with a manifest written last).

**AvgPipe** (``avgpipe``, N parallel pipelines) flushes every iteration too, and each rank
runs all N pipelines' updates and averaging steps (``U@k AV@k U@k#1 AV@k#1 ...``) before the
next iteration's first forward. There every stage's
:class:`~pipeweave.runtime.execution.elastic_averaging.ElasticAverager` is between iterations (nothing held but
the reference model), so a shard adds, per block: pipelines 1..N-1's parameters, optimizer
state and losses (``pipelines["<p>"]``; pipeline 0's stay at the top level as for every
schedule) and the ``reference`` model. The data position is ``N`` batches per step. N must
match on resume (:func:`_check_pipelines`).

Asynchronous schedules (PipeDream, 2BW, PipeOptim, SpecTrain, WPipe) have such a point only
where they drain (schedule option ``drain``, which ``--checkpoint-every N`` sets to ``N``,
:mod:`.drain`): elsewhere micro-batches of iteration ``k`` are still in flight, with stashed
activations and weight versions, when iteration ``k + 1`` starts. At a drain the state is the
same as at a flush; PipeOptim's and SpecTrain's prediction direction is re-read from the
optimizer state (see docs/checkpoints.md).

**AvgPipe's online advance** (``Job.advance``) runs each step, until its controller settles,
as a program of its own (:mod:`..advance.online`); its checkpoints are taken between two such
windows (:meth:`RankRecovery.checkpoint_window`), the same flushed state as above plus the
controller's state in the manifest (``advance``), which a resumed run restores
(:attr:`RankRecovery.advance_state`).

**Keyed by block.** Parameters and optimizer state are stored under ``"<block>.<name>"``
(the names :class:`~pipeweave.runtime.execution.parts.RankResult` uses), written by the first replica
of each stage. A resumed run finds each of its blocks wherever it was, so the stage count,
split, chunks and replicas may all change between checkpoint and resume. The tensors are
always whole: a stage sharded over ``dp`` (FSDP2) or split over ``tp`` gathers them at the
checkpoint (all its ranks and processes, a collective) and its first process writes them; a
resumed sharded or split stage cuts its own part out (:func:`..communication.sharded.laid_out_like`),
so the mesh may change too (docs/sharding.md, "Checkpoints").

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
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from ...ir import Schedule
from .boundaries import clean_boundaries
from .resume import Session
from .restore import restore_rank
from .store import StoredCheckpoint
from .writer import CheckpointWriter
from ..job import Job
from ..execution.parts import RankParts

__all__ = ["RankRecovery"]


class RankRecovery:
    """One rank's resume point and checkpoint writer (both no-ops without ``job.checkpoint``).

    Use: build the rank's parts, then ``recovery = RankRecovery(...)`` (restores them when
    resuming), feed the data through :meth:`positioned` with ``first_batch``, start the
    interpreter at :attr:`start` with :attr:`hooks`, and :meth:`close` after the run.
    """

    def __init__(self, *, job: Job, schedule: Schedule, rank: int, parts: RankParts,
                 device: torch.device, session: Session | None, apply_rng: bool = True,
                 stored: StoredCheckpoint | None = None, writes: bool = True) -> None:
        """The checks on ``job`` and the checkpoint were made once by
        :func:`~pipeweave.runtime.launch.prepare.prepare`; ``stored``: the checkpoint
        ``session`` resumes, if already open; ``writes`` False: a tensor-parallel process
        other than its group's first (it gathers, the first writes)."""
        self.job = job
        self.steps_done = 0
        """Steps already done when this run starts (the checkpoint's step)."""
        self.start = 0
        """Position in the rank's program to start at."""
        self.rng_state: Tensor | None = None
        """CPU RNG state to start from (None: the run's seed)."""
        self.writer: CheckpointWriter | None = None
        self.advance_state: dict[str, Any] | None = None
        """The online advance controller's state saved with the checkpoint resumed (None:
        not resuming, or saved without the controller)."""
        options = job.checkpoint
        if options is None:
            return
        cuts = clean_boundaries(schedule, rank)  # checked by prepare (check_checkpointable)
        if session is not None and session.resume_from is not None:
            if stored is None or str(stored.folder) != session.resume_from:
                stored = StoredCheckpoint(session.resume_from, verify=False)
            point = restore_rank(stored, job=job, schedule=schedule, rank=rank, parts=parts,
                                 device=device, cuts=cuts, apply_rng=apply_rng)
            self.steps_done, self.start, self.rng_state = (point.steps_done, point.start,
                                                           point.rng_state)
            self.advance_state = stored.manifest.get("advance")
        if options.directory is not None:
            assert session is not None, "writing checkpoints needs the run's session"
            self.writer = CheckpointWriter(job=job, schedule=schedule, rank=rank, parts=parts,
                                           device=device, session=session, cuts=cuts,
                                           steps_done=self.steps_done, writes=writes)

    @property
    def hooks(self) -> dict[int, Callable[[], None]]:
        """``position -> callable`` the interpreter runs after that action (checkpoint writes)."""
        return self.writer.hooks if self.writer is not None else {}

    def window_hooks(self, program: Schedule) -> dict[int, Callable[[], None]]:
        """The hooks of a window's ``program`` under the online advance controller: the fence
        of a checkpoint taken before it (:meth:`checkpoint_window`)."""
        return self.writer.window_hooks(program) if self.writer is not None else {}

    def checkpoint_window(self, steps_done: int, advance: dict[str, Any]) -> None:
        """Under the online advance controller, between windows: the checkpoint after
        ``steps_done`` steps if one is due, with the controller's state ``advance``."""
        if self.writer is not None:
            self.writer.checkpoint_window(steps_done, advance)

    @property
    def stall_s(self) -> float:
        """Seconds the training thread spent on checkpoints (capture and fences)."""
        return self.writer.stall_s if self.writer is not None else 0.0

    @property
    def first_batch(self) -> int:
        """Index of the first batch of the data stream this run reads."""
        return self.steps_done * self.job.plan.pipelines

    def positioned(self, stream: Iterable[Any]) -> Iterable[Any]:
        """``stream`` moved to :attr:`first_batch` (``load_state_dict`` when it has one)."""
        state = getattr(stream, "state_dict", None)
        if callable(state) and callable(getattr(stream, "load_state_dict", None)):
            current = dict(state())
            description = {k: v for k, v in current.items() if k != "position"}
            if self.writer is not None:
                self.writer.stream = description
            if self.first_batch:
                stream.load_state_dict({**current, "position": self.first_batch})  # type: ignore[attr-defined]
            return stream
        return itertools.islice(stream, self.first_batch, None) if self.first_batch else stream

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for the pending checkpoints to be on disk (and complete); raise a writer's
        error (unless ``raise_errors`` is False: the run is failing already)."""
        if self.writer is not None:
            self.writer.close(raise_errors=raise_errors)
