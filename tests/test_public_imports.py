"""Who may import what beyond the layers (issue 27, item 3): the CLI's commands do not import
each other (what two share lives in ``cli/options.py`` or ``cli/model_options.py``), the
benchmarks use only the public names of the library (a module's ``__all__``, never the CLI),
and the measurement layer's public functions take their options by keyword."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CLI = SRC / "pipeweave" / "cli"


def _imported(path: Path, package: str = "") -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in ``path``, a module of ``package`` (relative
    imports resolved against it; nested imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def _module_all(module: str) -> set[str] | None:
    """The ``__all__`` of ``module`` read from its source (None: it has none)."""
    base = SRC.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == "__all__" for t in targets):
            assert isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            return set(ast.literal_eval(node.value))
    return None


def _is_module(module: str, name: str) -> bool:
    base = SRC.joinpath(*module.split("."), name)
    return base.is_dir() or base.with_suffix(".py").exists()


def test_no_command_imports_another() -> None:
    crossing = []
    for path in sorted(CLI.glob("cmd_*.py")):
        for module, names in _imported(path, "pipeweave.cli"):
            targets = [module] + [f"{module}.{n}" for n in names]
            crossing += [f"{path.name} -> {t}" for t in targets
                         if t.startswith("pipeweave.cli.cmd_")]
    assert not crossing, ("a command imports another; move what they share to cli/options.py:\n"
                          + "\n".join(crossing))


def test_the_check_sees_a_command_importing_another(tmp_path: Path) -> None:
    """The scan above resolves relative imports, nested in functions too."""
    fake = tmp_path / "cmd_fake.py"
    fake.write_text("def f() -> None:\n    from .cmd_plan import run\n    from . import cmd_show\n")
    found = _imported(fake, "pipeweave.cli")
    assert ("pipeweave.cli.cmd_plan", ["run"]) in found
    assert ("pipeweave.cli", ["cmd_show"]) in found


def test_benchmarks_import_only_public_names() -> None:
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for module, names in _imported(path):
            if not module.startswith("pipeweave"):
                continue
            if module == "pipeweave.cli" or module.startswith("pipeweave.cli."):
                found.append(f"{path.name}: {module} (the CLI's internals)")
                continue
            public = _module_all(module)
            for name in names:
                if _is_module(module, name):
                    continue
                if public is None or name not in public:
                    found.append(f"{path.name}: {module}.{name} (not in its __all__)")
    assert not found, "benchmarks import what is not public:\n" + "\n".join(found)


def test_measure_functions_take_options_by_keyword() -> None:
    """At most one positional parameter (the thing measured), every parameter typed."""
    import pipeweave.measure as measure

    loose = []
    for name in measure.__all__:
        item = getattr(measure, name)
        if not inspect.isfunction(item):
            continue
        parameters = list(inspect.signature(item).parameters.values())
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY,
                                                          p.POSITIONAL_OR_KEYWORD)]
        if len(positional) > 1 or any(p.annotation is p.empty for p in parameters):
            loose.append(name)
    assert not loose, f"take their options by keyword, typed: {loose}"
