"""Suite-wide rules.

* The suite writes only under temporary folders: every test runs in a scratch working folder
  of its own, so a command it runs with default outputs (``train``'s ``runs/``, ``auto``'s
  ``auto-plan.json`` and ``auto-pareto.png``) cannot write into the repository. Tests that
  read the repository's files find them from ``__file__``.
* Tests marked ``cuda`` need a CUDA device: collected everywhere, skipped where torch sees
  none (docs/gpu.md). ``pytest -m cuda`` selects just them on a GPU machine.
* Ctrl-C is delivered as in a terminal: a suite started in the background by a
  non-interactive shell (``cmd &``, ``nohup``) inherits SIGINT *ignored*, which Python keeps,
  and then the Ctrl-C tests (``tests/runtime/launch/test_interrupts.py``) would test the
  shell rather than pipeweave. Python's own handler is put back for the session (and for the
  processes it starts, which get the default disposition on exec).
* With ``PIPEWEAVE_TEST_CORES=k`` under pytest-xdist each worker is pinned to its own ``k``
  cores (``tests/worker_cores.py``), so a many-core host runs the suite as many small machines
  (``scripts/gpu_check.sh suite``).
"""

from __future__ import annotations

import signal

import pytest
from worker_cores import pin_this_worker


def pytest_configure(config: pytest.Config) -> None:
    pin_this_worker()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _scratch_working_folder(tmp_path_factory: pytest.TempPathFactory,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)
