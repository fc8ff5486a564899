"""CheckpointOptions: when a run writes checkpoints, where, and what it resumes from.

Plain, picklable data on the :class:`~pipeweave.runtime.job.Job` (``job.checkpoint``); the
mechanics live in :mod:`pipeweave.runtime.checkpoint.recovery` (rank state, resume points) and
:mod:`pipeweave.runtime.checkpoint.store` (files, manifest, checksums).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CheckpointOptions", "AUTO"]

AUTO = "auto"
"""``resume=AUTO``: continue from ``directory``'s newest complete checkpoint if there is one,
otherwise start from step 0 (what a ``torchrun --max-restarts`` restart wants)."""


@dataclass(frozen=True)
class CheckpointOptions:
    """Checkpoint and resume settings of a run.

    Attributes:
        directory: where checkpoints are written (one ``step-<k>-<run>`` folder per
            checkpoint, a ``latest`` pointer file); ``None`` writes none.
        every: write after every ``every`` completed steps (0: only ``at`` and the end).
        at: also write after these step counts (1-based: ``at=(3,)`` is after 3 steps).
        at_end: write after the last step.
        resume: a checkpoint folder (a run's ``directory`` or one ``step-*`` folder inside it)
            to continue from, ``"auto"`` (``directory``'s newest, or a fresh start), or ``None``.
    """

    directory: str | None = None
    every: int = 0
    at: tuple[int, ...] = ()
    at_end: bool = True
    resume: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(
                f"checkpoint every={self.every!r} is invalid; give an int >= 0 (0 = only at the "
                f"end), e.g. --checkpoint-every 10"
            )
        object.__setattr__(self, "at", tuple(int(step) for step in self.at))
        if any(step < 1 for step in self.at):
            raise ValueError(f"checkpoint at={list(self.at)} must name steps >= 1 (1-based)")
        if self.resume == AUTO and self.directory is None:
            raise ValueError(
                "resume='auto' looks for checkpoints in the checkpoint directory, but none is "
                "set; pass --checkpoint-dir DIR with --resume auto"
            )
        if self.directory is not None:
            object.__setattr__(self, "directory", str(self.directory))
        if self.resume is not None:
            object.__setattr__(self, "resume", str(self.resume))

    def writes_after(self, steps_done: int, total: int) -> bool:
        """Whether a checkpoint is due once ``steps_done`` of ``total`` steps are complete."""
        if self.directory is None or steps_done < 1:
            return False
        if steps_done == total:
            return self.at_end or steps_done in self.at or (
                self.every > 0 and steps_done % self.every == 0)
        return steps_done in self.at or (self.every > 0 and steps_done % self.every == 0)
