"""Pinning of pytest-xdist workers (tests/worker_cores.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker_cores import worker_cores


def test_each_worker_gets_its_own_cores_until_the_slots_run_out() -> None:
    allowed = list(range(16))
    assert worker_cores("gw0", 2, allowed) == {0, 1}
    assert worker_cores("gw6", 2, allowed) == {12, 13}
    assert worker_cores("gw7", 2, allowed) == {14, 15}
    assert worker_cores("gw8", 2, allowed) == {0, 1}
    slots = [worker_cores(f"gw{n}", 2, allowed) for n in range(8)]
    assert set().union(*slots) == set(allowed) and sum(map(len, slots)) == 16


def test_the_allowed_set_is_read_in_order_and_a_small_host_keeps_all_its_cores() -> None:
    assert worker_cores("gw1", 2, [9, 3, 5, 7]) == {7, 9}
    assert worker_cores("gw3", 4, [0, 1]) == {0, 1}


@pytest.mark.parametrize("worker, per_worker", [("main", 2), ("gw", 2), ("gw1", 0)])
def test_bad_settings_are_refused_in_one_line(worker: str, per_worker: int) -> None:
    with pytest.raises(ValueError, match="PIPEWEAVE_TEST_CORES|gwN") as caught:
        worker_cores(worker, per_worker, [0, 1, 2, 3])
    assert "\n" not in str(caught.value)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs affinity masks and two cores")
def test_a_pinned_worker_and_the_threads_its_ranks_get_see_only_its_cores() -> None:
    """A real process pinned as worker gw1 of one core each: pipeweave's own answer to 'how
    many threads does each of 1 local rank get' is 1, not the host's count."""
    here = Path(__file__).resolve().parent
    src = here.parent / "src"
    code = ("import os, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from worker_cores import pin_this_worker; pin_this_worker()\n"
            "from pipeweave.host import threads_per_rank\n"
            "print(sorted(os.sched_getaffinity(0)), threads_per_rank(1))")
    env = dict(os.environ, PIPEWEAVE_TEST_CORES="1", PYTEST_XDIST_WORKER="gw1")
    done = subprocess.run([sys.executable, "-c", code, str(here), str(src)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    expected = sorted(os.sched_getaffinity(0))[1]
    assert done.stdout.split("]")[0] == f"[{expected}"
    assert done.stdout.split()[-1] == "1"
