"""Where ``pipeweave train`` writes, and how a refused run leaves no trace of it.

Without ``--output-dir`` a run writes to ``runs/<date>-<time>-<schedule>/`` and
``runs/latest`` links to the newest run's folder. :func:`new_run_folder` only names the
folder; :func:`open_outputs` creates the output folders (probing that each can be written)
and moves ``runs/latest``, and is called after every check of the command line and of the job
(:func:`pipeweave.runtime.launch.prepare.prepare`) has passed. What it did is an
:class:`Opened`, whose :meth:`Opened.undo` removes the folders it created (those still empty)
and puts ``runs/latest`` back, for a refusal that can only come later (a ``ValueError`` while
the ranks start): a refused command leaves the folder it ran in as it found it.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RUNS", "LATEST", "Opened", "new_run_folder", "open_outputs", "check_writable"]

RUNS = Path("runs")
LATEST = "latest"


@dataclass
class Opened:
    """What :func:`open_outputs` created: folders (outermost first) and the moved link."""

    folders: list[Path] = field(default_factory=list)
    latest: Path | None = None
    """``runs/latest`` if this run moved it."""
    previous: str | None = None
    """Where ``latest`` pointed before (None: there was no link)."""

    def undo(self) -> None:
        """Remove the created folders that are still empty (deepest first) and restore
        ``runs/latest``; never removes a file."""
        if self.latest is not None:
            _link(self.latest, self.previous)
        for folder in reversed(self.folders):
            try:
                folder.rmdir()
            except OSError:  # not empty (someone wrote there) or already gone: keep it
                pass
        self.folders.clear()
        self.latest = None


def new_run_folder(schedule: str | None, plan: Path | None, default_schedule: str, *,
                   torchrun_id: str | None = None) -> Path:
    """The name of a new ``runs/<date>-<time>-<schedule>`` (a suffix if that exists); nothing
    is created. Under torchrun every rank must agree and a restarted attempt must find its
    checkpoints: the folder is named after torchrun's run id (``torchrun_id``) instead."""
    if schedule is None and plan is not None:
        try:
            schedule = json.loads(Path(plan).read_text()).get("schedule")
        except (OSError, ValueError, AttributeError):
            schedule = None  # the command's own check reports a bad plan file
    schedule = str(schedule or default_schedule)
    if torchrun_id is not None:
        return RUNS / f"{torchrun_id}-{schedule}"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder, attempt = RUNS / f"{stamp}-{schedule}", 1
    while folder.exists():
        attempt += 1
        folder = RUNS / f"{stamp}-{schedule}-{attempt}"
    return folder


def check_writable(directory: Path, flag: str, opened: Opened) -> None:
    """Create ``directory`` (recording in ``opened`` the folders that did not exist) and write
    a probe file there, so a folder that cannot hold the outputs stops the run before training
    instead of losing its results after it."""
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        opened.folders.extend(p for p in reversed(missing) if p not in opened.folders)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".pipeweave-probe-"):
            pass
    except OSError as error:
        opened.folders.extend(p for p in reversed(missing)
                              if p.is_dir() and p not in opened.folders)
        raise ValueError(f"{flag} {directory} cannot be written ({error.strerror or error}); "
                         f"give a folder you can write to") from None


def open_outputs(writable: list[tuple[Path, str]], *, fresh: Path | None) -> Opened:
    """Create and probe each ``(folder, flag)``, then point ``runs/latest`` at ``fresh`` (the
    new run folder, if the run has one). A refusal here undoes what it created first."""
    opened = Opened()
    try:
        for directory, flag in writable:
            check_writable(directory, flag, opened)
    except ValueError:
        opened.undo()
        raise
    if fresh is not None:
        latest = fresh.parent / LATEST
        if latest.exists() and not latest.is_symlink():
            print(f"note: {latest} is a folder, not a link; this run writes to {fresh}")
        else:
            previous = os.readlink(latest) if latest.is_symlink() else None
            if _link(latest, fresh.name):
                opened.latest, opened.previous = latest, previous
    return opened


def _link(latest: Path, target: str | None) -> bool:
    """Make ``latest`` a link to ``target`` (replaced atomically), or remove it (``None``);
    False where this filesystem has no links (the folder's name is printed anyway)."""
    if target is None:
        latest.unlink(missing_ok=True)
        return True
    temporary = latest.parent / f".{latest.name}-{os.getpid()}"
    try:
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target, target_is_directory=True)
        os.replace(temporary, latest)
        return True
    except OSError:
        temporary.unlink(missing_ok=True)
        return False
