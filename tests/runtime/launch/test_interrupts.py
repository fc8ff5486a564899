"""Ctrl-C around local ranks (runtime/launch/interrupts.py): the fork server and the ranks it
forks ignore SIGINT until a rank listens. Holding a Ctrl-C while the launcher starts ranks is
tests/test_ctrl_c_deferred.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"

# In a fresh interpreter: this test process may already run a fork server started otherwise.
FORKED = """
import multiprocessing as mp, signal
from pipeweave.runtime.launch.interrupts import listen_for_ctrl_c, start_forkserver_deaf

def child(queue):
    before = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    listen_for_ctrl_c()
    queue.put((before, signal.getsignal(signal.SIGINT) is signal.default_int_handler))

if __name__ == "__main__":
    start_forkserver_deaf()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the launcher listens
    context = mp.get_context("forkserver")
    queue = context.SimpleQueue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    print(queue.get())
    process.join()
"""


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ranks_forked_by_the_fork_server_ignore_ctrl_c_until_they_listen(tmp_path: Path) -> None:
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(True, True)"
