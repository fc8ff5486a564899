"""Why a local run stopped, from what its ranks left in the launcher's folder.

Each rank writes there: ``rank{N}.error.json`` when it raises (type, message, traceback),
``rank{N}.partial.pkl`` (what it had done, attached to its error), ``rank{N}.journal`` (what it
had done, after every optimizer step: all a killed rank leaves) and ``rank{N}.stderr`` (what
native code printed). :func:`diagnose` names the rank that caused a failure and why;
:func:`partials` gathers what every rank had done; :func:`rank_output` what they printed.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from ..observation.journal import read_journal
from ..observation.results import RankResult, attach_partial
from .watch import killed_by

__all__ = ["RunFailed", "RunInterrupted", "diagnose", "partials", "rank_output", "ERROR_FILE",
           "PARTIAL_FILE", "JOURNAL_FILE", "STDERR_FILE", "USER_ERRORS"]


class RunFailed(RuntimeError):
    """A rank failed; the message names it and includes its error.

    ``rank``, ``cause`` (the error's one-line message, without its type) and ``trace`` (the
    failing rank's traceback) are kept apart for front ends that show one line and log the
    rest (``pipeweave train``).
    """

    def __init__(self, message: str, *, rank: int | None = None, cause: str | None = None,
                 trace: str = "", partial: list[RankResult] | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.cause = cause if cause is not None else message.splitlines()[0]
        self.trace = trace
        attach_partial(self, *(partial or []))


class RunInterrupted(RunFailed):
    """The run was interrupted (Ctrl-C); what the ranks had done comes with it."""


ERROR_FILE = "rank{}.error.json"
PARTIAL_FILE = "rank{}.partial.pkl"
JOURNAL_FILE = "rank{}.journal"
STDERR_FILE = "rank{}.stderr"
USER_ERRORS = (ValueError, ArithmeticError, LookupError, TypeError, OSError)
"""Error types that report a bad input or a diverging run rather than a lost peer; when
several ranks fail at once, one of these is the cause to show."""


def _file_rank(path: Path) -> int:
    """The rank a ``rank{N}.*`` file of the results folder belongs to."""
    return int(path.name[4:].split(".")[0])


def partials(out_dir: Path) -> list[RankResult]:
    """What failed, killed or interrupted ranks had done, by rank: what a rank attached to its
    error (:func:`attach_partial`), else its journal (a killed rank attached nothing)."""
    found: list[RankResult] = []
    # by rank number: sorting the names would put rank10 before rank2
    ranks = {_file_rank(path) for pattern in (PARTIAL_FILE, JOURNAL_FILE)
             for path in out_dir.glob(pattern.format("*"))}
    for rank in sorted(ranks):
        try:
            with open(out_dir / PARTIAL_FILE.format(rank), "rb") as handle:
                found.extend(pickle.load(handle))
            continue
        except (OSError, pickle.UnpicklingError, EOFError):
            pass
        journal = read_journal(out_dir / JOURNAL_FILE.format(rank))
        if journal is not None:
            found.append(journal)
    return found


def rank_output(out_dir: Path) -> str:
    """What the ranks wrote to their diverted stderr, each under a heading ("" if nothing)."""
    parts = []
    for path in sorted(out_dir.glob(STDERR_FILE.format("*")), key=_file_rank):
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- rank {_file_rank(path)} wrote to stderr ---\n{text}\n")
    return "".join(parts)


def diagnose(out_dir: Path, processes: list[BaseProcess], error_files: list[str],
              first: int) -> RunFailed:
    """Why the run failed, once rank ``first`` exited with a non-zero code.

    A rank killed by a signal (SIGKILL: the out-of-memory killer, ``kill -9``) leaves no
    traceback, and its peers then fail on the lost connection: unless some rank reported a
    bad input, the killed rank is the cause."""
    time.sleep(0.3)  # ranks fail within moments of each other: let their reports arrive
    reports = _reports(out_dir)
    killed = [i for i, process in enumerate(processes) if killed_by(process) is not None]
    if killed and not any(report["user_error"] for report in reports.values()):
        rank = first if first in killed else killed[0]
        process = processes[rank]
        cause = (f"exited with code {process.exitcode} (signal {killed_by(process)}); all other "
                 f"ranks were stopped")
        note = (f"rank {rank} (pid {process.pid}) was ended by {killed_by(process)} and left no "
                f"traceback: it was killed from outside (the kernel's out-of-memory killer, "
                f"kill -9, a lost machine); the launcher stopped the other ranks.\n")
        return RunFailed(f"rank {rank} {cause}", rank=rank, cause=cause, trace=note)
    rank, cause, trace = _root_cause(out_dir, first, _torch_trace(error_files[first]),
                                     reports=reports)
    if not trace:
        cause = f"exited with code {processes[rank].exitcode}; all other ranks were stopped"
        return RunFailed(f"rank {rank} {cause}", rank=rank, cause=cause)
    return RunFailed(f"rank {rank} failed: {cause}\n"
                     f"all other ranks were stopped; the failing rank's traceback:\n{trace}",
                     rank=rank, cause=cause, trace=trace)


def _torch_trace(error_file: str) -> str:
    """The traceback torch's wrapper saved for a rank that raised ("" if none)."""
    try:
        with open(error_file, "rb") as handle:
            return str(pickle.load(handle)).strip()
    except (OSError, pickle.UnpicklingError, EOFError):
        return ""


def _reports(out_dir: Path) -> dict[int, dict[str, Any]]:
    """The error reports failed ranks wrote (``_spawned_rank``), by rank."""
    reports = {}
    for path in out_dir.glob(ERROR_FILE.format("*")):
        try:
            reports[_file_rank(path)] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return reports


def _root_cause(out_dir: Path, first: int, first_trace: str, *,
                reports: dict[int, dict[str, Any]] | None = None) -> tuple[int, str, str]:
    """``(rank, one-line cause, traceback)`` of a failed run.

    The rank that failed first may only have lost its peer (a closed connection) while
    another rank holds the real cause: prefer a bad input or a diverging loss over a lost
    peer.
    """
    reports = _reports(out_dir) if reports is None else reports
    chosen = next((r for r in sorted(reports) if reports[r]["user_error"]),
                  first if first in reports else None)
    if chosen is None:
        lines = first_trace.splitlines()
        return first, lines[-1] if lines else "unknown error", first_trace
    report = reports[chosen]
    message = " ".join(report["message"].split()) if report["message"] else report["type"]
    if not report["user_error"] and report["message"]:  # not a bad input: say what broke
        message = f"{report['type']}: {message}"
    return chosen, message, report["trace"]
