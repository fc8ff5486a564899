"""House rules that hold for every module under ``src/`` (issue 27, item 5; STYLE.md).

No function (or method) is longer than :data:`MAX_LINES` lines, from its ``def`` line to its
last line, docstring and nested functions included. The source is parsed with ``ast``, so the
check needs no import and no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 60

ALLOWED: set[str] = set()
"""Functions allowed over the limit: none (the last, CheckpointWriter._capture, was split)."""


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int, int]]:
    """``(qualified name, first line, line count)`` of every function in ``tree``."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            assert node.end_lineno is not None
            found.append((name, node.lineno, node.end_lineno - node.lineno + 1))
            found += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, prefix + node.name + ".")
        else:
            found += _functions(node, prefix)
    return found


def _long_functions() -> dict[str, str]:
    """``path::name`` -> where and how long, for every function over the limit."""
    long = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        for name, line, count in _functions(ast.parse(path.read_text(), filename=str(path))):
            if count > MAX_LINES:
                long[f"{relative}::{name}"] = f"{relative}:{line} {name} ({count} lines)"
    return long


def test_no_function_is_longer_than_the_limit() -> None:
    long = _long_functions()
    over = sorted(where for key, where in long.items() if key not in ALLOWED)
    assert not over, (f"functions over {MAX_LINES} lines; split them into named helpers:\n"
                      + "\n".join(over))


def test_the_allow_list_holds_only_functions_still_too_long() -> None:
    stale = sorted(ALLOWED - set(_long_functions()))
    assert not stale, f"no longer over {MAX_LINES} lines (or gone); remove from ALLOWED: {stale}"


def test_the_check_sees_a_long_function_and_a_long_method() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = f"def f() -> None:\n{body}\n\nclass C:\n    def m(self) -> None:\n" + \
        "\n".join("    " + line for line in body.splitlines())
    counts = {name: count for name, _, count in _functions(ast.parse(source))}
    assert counts == {"f": MAX_LINES + 1, "C.m": MAX_LINES + 1}
