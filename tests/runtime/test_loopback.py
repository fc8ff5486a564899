"""pipeweave's own launcher keeps every listening socket on loopback (issue 13, item 14).

While a two-rank job runs, the test reads the kernel's socket tables (``/proc/net/tcp`` and
``tcp6``) and the open descriptors of this process and its descendants (the launcher, the
forkserver, the ranks), and checks that each socket they listen on is bound to 127.0.0.1
or ::1, never to every interface.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeweave.runtime import launch_local

from runtime_jobs import mlp_job

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 (kernel byte order)
ANY = {"00000000", "00000000000000000000000000000000"}


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (OSError, IndexError):
                continue
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found.update(children)
        frontier.extend(children)
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def _listening(inodes: set[str]) -> set[str]:
    """Local addresses (hex, as the kernel prints them) of LISTEN sockets among ``inodes``."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                addresses.add(fields[1].split(":")[0])
    return addresses


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_every_listening_socket_of_a_local_run_is_on_loopback() -> None:
    job = mlp_job(depth=2, steps=60, record_timeline=False)
    outcome: dict[str, object] = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("results", launch_local(job)))
    runner.start()
    seen: set[str] = set()
    ranks_seen = 0
    while runner.is_alive():
        pids = _descendants(os.getpid())
        ranks_seen = max(ranks_seen, len(pids) - 1)
        seen |= _listening(_socket_inodes(pids))
        time.sleep(0.05)
    runner.join()
    assert "results" in outcome, "the job did not finish"
    assert seen, "no listening socket was observed (the run ended before the check)"
    assert not seen & ANY, f"a socket listens on every interface: {sorted(seen)}"
    assert seen <= LOOPBACK, f"sockets listen off loopback: {sorted(seen)}"
