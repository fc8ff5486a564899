"""Run by test_bad_checkpoints.py in a subprocess: train with a checkpoint after every step and
SIGKILL this process in the middle of writing shard number ``KILL_AT`` (bytes half written).

Usage: python crash_while_writing.py DIRECTORY KILL_AT
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from pipeweave.runtime import run_local
from pipeweave.runtime.checkpoint import store as checkpoint_store

from checkpoint_jobs import mlp_job, with_checkpoints

directory, kill_at = sys.argv[1], int(sys.argv[2])
started = 0
lock = threading.Lock()
original = checkpoint_store._HashingWriter.__init__


def counting_init(self, handle):  # type: ignore[no-untyped-def]
    global started
    original(self, handle)
    with lock:
        started += 1
        self.doomed = started == kill_at


def write(self, data):  # type: ignore[no-untyped-def]
    if getattr(self, "doomed", False) and self.size > 2000:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-shard: the temporary file is half written
    self.digest.update(data)
    self.size += len(data)
    return self.handle.write(data)


checkpoint_store._HashingWriter.__init__ = counting_init  # type: ignore[method-assign]
checkpoint_store._HashingWriter.write = write  # type: ignore[method-assign]
run_local(with_checkpoints(mlp_job(depth=2, steps=6), directory=directory, every=1))
print("not killed")
