"""The suite writes only under temporary folders: every test runs in a scratch working folder
of its own, so a command it runs with default outputs (``train``'s ``runs/``, ``auto``'s
``auto-plan.json`` and ``auto-pareto.png``) cannot write into the repository. Tests that read
the repository's files find them from ``__file__``."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _scratch_working_folder(tmp_path_factory: pytest.TempPathFactory,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
