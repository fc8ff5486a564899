"""How busy the machine is: the benchmarks' guard against other jobs on a shared machine.

``busy_share`` samples /proc/stat, ``wait_for_quiet`` holds a run back until the CPUs are
mostly idle, and ``ForeignLoad`` measures the CPU that processes outside the benchmark's own
process tree used during a run (so a disturbed run can be redone or flagged). Linux only;
elsewhere every measure reads 0. ``timed`` is the median wall time of repeated calls (the
median, so that a call another job interrupted does not count).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["busy_share", "wait_for_quiet", "ForeignLoad", "timed"]


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def busy_share(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over ``seconds`` (Linux /proc/stat; 0.0 elsewhere).

    Sampled while no benchmark rank runs, so it measures everyone else on the machine.
    """
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return 0.0
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet(max_wait_s: float, busy_limit: float = 0.25, sample_s: float = 1.0) -> float:
    """Wait (up to ``max_wait_s``) until other processes use less than ``busy_limit`` of the
    CPUs, sampling ``sample_s`` at a time.

    On a shared machine another job's burst can halve one run's throughput; starting runs
    only when the machine is quiet keeps such bursts out of most runs. Returns the busy
    share seen last (recorded with each run).
    """
    deadline = time.monotonic() + max_wait_s
    busy = busy_share(sample_s)
    while busy > busy_limit and time.monotonic() < deadline:
        busy = busy_share(sample_s)
    return busy


class ForeignLoad:
    """Measures the CPU that processes outside this benchmark's process tree use meanwhile.

    A thread samples /proc every 0.25 s; ours are this process and its descendants (the
    forkserver and the ranks). ``share`` is foreign CPU time over wall time x CPUs. Linux
    only; elsewhere ``share`` stays 0.
    """

    def __init__(self) -> None:
        self.share = 0.0
        self._ticks: dict[int, int] = {}
        self._foreign_ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _snapshot() -> dict[int, tuple[int, int]]:
        """pid -> (parent pid, CPU ticks used so far)."""
        table = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue  # gone meanwhile
                table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        return table

    def _sample(self, first: bool = False) -> None:
        table = self._snapshot()
        ours, grew = {os.getpid()}, True
        while grew:
            grew = False
            for pid, (parent, _) in table.items():
                if parent in ours and pid not in ours:
                    ours.add(pid)
                    grew = True
        for pid, (_, ticks) in table.items():
            if pid not in ours and not first:
                self._foreign_ticks += ticks - self._ticks.get(pid, 0)
            self._ticks[pid] = ticks

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def __enter__(self) -> "ForeignLoad":
        self._started = time.monotonic()
        if Path("/proc/self/stat").exists():
            self._sample(first=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        wall = time.monotonic() - self._started
        cpu = self._foreign_ticks / os.sysconf("SC_CLK_TCK")
        self.share = cpu / max(wall * (os.cpu_count() or 1), 1e-9)
