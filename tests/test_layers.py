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
                                    "pipeweave.host", "pipeweave.auto", "pipeweave.memory",
                                    "pipeweave.devices"])
def test_imports_without_torch(module: str) -> None:
    code = (f"import sys; import {module}; "
            f"loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
            f"print(len(loaded), loaded[:3])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 "), f"{module} imports torch: {done.stdout}"


IMPORT_FIRST = Path(__file__).resolve().parent / "import_first.py"


def _import_first(src: Path, package: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(IMPORT_FIRST), str(src), package],
                          capture_output=True, text=True, env={"PYTHONPATH": str(src)},
                          timeout=300)


def test_every_module_imports_in_any_order() -> None:
    """No import cycle bites: each module imported first, with no other module of pipeweave
    loaded (tests/import_first.py says how, in forks)."""
    done = _import_first(SRC, "pipeweave")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_import_order_check_sees_a_cycle_that_bites_one_way(tmp_path: Path) -> None:
    """``cyc.a`` first imports fine; ``cyc.b`` first finds ``cyc.a`` half-built. A loop that
    imported both in one process, in order, would miss it."""
    package = tmp_path / "cyc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("A = 1\nfrom cyc import b\nC = b.B\n")
    (package / "b.py").write_text("from cyc.a import A\nB = 2\n")
    done = _import_first(tmp_path, "cyc")
    assert done.returncode == 1 and done.stdout.strip() == "failed", done.stdout
    assert "importing cyc.b first fails" in done.stderr, done.stderr
    assert "importing cyc.a first" not in done.stderr, done.stderr


# Layers, lowest first: a package may import only packages of a lower layer (or itself).
LAYERS = {
    "host": 0, "ir": 0, "files": 0, "collector": 0, "interrupts": 0, "model_names": 0,
    "lazy": 0,
    "schedules": 1, "models": 1, "data": 1, "split_backward": 1, "saved_tensors": 1,
    "precision": 1, "apc": 1, "devices": 1, "memory": 1,
    "sim": 2, "profiler": 2, "hf": 2,
    "planner": 3, "report": 3,
    "avgpipe": 4, "auto": 4,
    "runtime": 5,
    "oracle": 6, "testing": 6, "measure": 6,
    "cli": 7,
    "__main__": 8, "__init__": 8,
}
PACKAGE = SRC / "pipeweave"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, top_level_only: bool, type_only: bool = True) -> set[str]:
    """Modules of pipeweave that ``path`` imports (relative imports resolved); ``type_only``
    False: leave out the imports under ``if TYPE_CHECKING:`` (they run nothing)."""
    import ast

    tree = ast.parse(path.read_text())
    if not type_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                node.body = []
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            targets = [name] + [f"{name}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t.startswith("pipeweave."))
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_package_imports_a_package_above_it() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        here = _layer(_module_name(path)) if path.parent != PACKAGE else path.stem
        for target in _imports(path, top_level_only=False):
            there = _layer(target)
            if there not in LAYERS:
                continue  # pipeweave.<module>.<name>: a name, not a package
            if there != here and LAYERS[there] >= LAYERS[here]:
                upward.append(f"{path.relative_to(SRC)} -> {target}")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_no_import_cycle_between_modules() -> None:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {t for t in _imports(path, top_level_only=True) if t in modules}
             for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1 and not (name.startswith(target + ".") or target == name):
                cycles.append(trail[trail.index(target):] + [target] if target in trail
                              else [name, target])
            elif target not in state:
                visit(target, trail + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# Inside the runtime, lowest first: a sub-package may import only lower ones (or itself), so no
# two sub-packages import each other. No module is excused: the option records the job carries
# live in ``options``, below the job and the packages whose mechanics read them.
RUNTIME_LAYERS = {
    "communication": 0, "options": 0,
    "job": 1,
    "observation": 2,
    "execution": 3,
    "checkpoint": 4, "advance": 4,
    "launch": 5,
    "__init__": 6,
}


def _runtime_room(module: str) -> str | None:
    """The runtime sub-package (or module) ``module`` belongs to; None outside the runtime."""
    parts = module.split(".")
    if parts[:2] != ["pipeweave", "runtime"]:
        return None
    return "__init__" if len(parts) == 2 else parts[2]


def test_runtime_sub_packages_only_look_down() -> None:
    """Type-only imports may look up (a result names the parts it was collected from)."""
    upward = []
    for path in (PACKAGE / "runtime").rglob("*.py"):
        here = _runtime_room(_module_name(path))
        assert here in RUNTIME_LAYERS, f"{path}: add its sub-package to RUNTIME_LAYERS"
        for target in _imports(path, top_level_only=False, type_only=False):
            there = _runtime_room(target)
            if there is None or there not in RUNTIME_LAYERS or there == here:
                continue
            if RUNTIME_LAYERS[there] >= RUNTIME_LAYERS[here]:
                upward.append(f"{path.relative_to(SRC)} -> {target}")
    assert not upward, "runtime imports against its layers:\n" + "\n".join(sorted(upward))
