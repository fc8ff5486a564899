"""The layers above the runtime import without torch (issue 14, item 1): the plan, the planner,
the simulator, the IR and schedules, and the profiler's data types. Each check runs in a
fresh interpreter, so what an earlier test imported cannot hide a torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("module", ["pipeweave.planner", "pipeweave.planner.plan", "pipeweave.sim",
                                    "pipeweave.ir", "pipeweave.schedules", "pipeweave.profiler",
                                    "pipeweave.host"])
def test_imports_without_torch(module: str) -> None:
    code = (f"import sys; import {module}; "
            f"loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
            f"print(len(loaded), loaded[:3])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 "), f"{module} imports torch: {done.stdout}"


def test_every_module_imports_in_any_order() -> None:
    """No import cycle bites: each module imported first in a fresh interpreter."""
    modules = sorted(".".join(p.relative_to(SRC).with_suffix("").parts)
                     for p in (SRC / "pipeweave").rglob("*.py") if p.name != "__main__.py")
    modules = [m.removesuffix(".__init__") for m in modules]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    for loaded in [m for m in sys.modules if m.startswith('pipeweave')]:\n"
            "        del sys.modules[loaded]\n"
            "    importlib.import_module(name)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
