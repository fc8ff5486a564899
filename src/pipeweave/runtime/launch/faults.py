"""Faults: injecting a rank's death on purpose, and not outliving the launcher.

* :func:`injected_fault_hooks` reads ``PIPEWEAVE_INJECT_FAULT`` (e.g.
  ``rank=1,step=3,once=/tmp/killed-once``) and returns an interpreter hook that kills that
  rank with SIGKILL in the middle of that step (right after its first forward of the step).
  With ``once=PATH`` the kill happens only if PATH does not exist yet (it is created first),
  so a run restarted by ``torchrun --max-restarts`` survives the second time. This is how the
  recovery tests and docs/checkpoints.md kill a real rank of a ``pipeweave train`` run.
* :func:`exit_with_launcher` makes a rank exit when the process that launched it is gone, so
  killing the launcher (even with SIGKILL) leaves no rank behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ...ir import Op, Schedule

__all__ = ["FAULT_ENV", "parse_fault", "injected_fault_hooks", "kill_self", "exit_with_launcher"]

FAULT_ENV = "PIPEWEAVE_INJECT_FAULT"


def parse_fault(text: str) -> dict[str, str]:
    """``"rank=1,step=3[,once=PATH]"`` as a dict; ValueError naming the expected form."""
    fields = dict(part.partition("=")[::2] for part in text.split(",") if part)
    if set(fields) - {"rank", "step", "once"} or not {"rank", "step"} <= set(fields) or not (
            fields["rank"].isdigit() and fields["step"].isdigit() and int(fields["step"]) >= 1):
        raise ValueError(f"{FAULT_ENV}={text!r} is invalid; use rank=R,step=S[,once=PATH] with "
                         f"R >= 0 and S >= 1 (kill rank R during step S)")
    return fields


def kill_self(once: str | None = None) -> None:
    """SIGKILL this process (no cleanup, like a crashed machine); with ``once``, only the first
    time: the marker file is created (and synced) before dying and suppresses later kills."""
    if once is not None:
        marker = Path(once)
        if marker.exists():
            return
        with open(marker, "w") as handle:
            handle.write(f"killed pid {os.getpid()}\n")
            handle.flush()
            os.fsync(handle.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def injected_fault_hooks(schedule: Schedule, rank: int,
                         environ: Mapping[str, str] | None = None) -> dict[int, Callable[[], None]]:
    """The hook ``PIPEWEAVE_INJECT_FAULT`` asks for on ``rank`` (usually none)."""
    text = (os.environ if environ is None else environ).get(FAULT_ENV)
    if not text:
        return {}
    fault = parse_fault(text)
    if int(fault["rank"]) != rank:
        return {}
    iteration = int(fault["step"]) - 1
    first = schedule.microbatches * iteration
    for position, action in enumerate(schedule.programs[rank]):
        if (action.op is Op.FORWARD and action.microbatch is not None
                and first <= action.microbatch < first + schedule.microbatches):
            once = fault.get("once")
            return {position: lambda: kill_self(once)}
    return {}


def exit_with_launcher(launcher_pid: int, *, interval_s: float = 0.5) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 70) once ``launcher_pid`` is
    gone. A rank's parent may be a fork server, not the launcher, so it watches the pid."""
    def watch() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os._exit(70)
            except PermissionError:  # alive, owned by someone else (pid reused): keep watching
                pass

    thread = threading.Thread(target=watch, name="exit-with-launcher", daemon=True)
    thread.start()
    return thread
