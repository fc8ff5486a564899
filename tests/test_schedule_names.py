"""No module outside ``schedules/`` tests a schedule's name (issue 27, item 2).

What a schedule supports is declared on its registry entry
(:class:`pipeweave.schedules.ScheduleInfo`) and every caller asks the entry; a comparison
such as ``plan.schedule == "avgpipe"`` or ``name in ("2bw", "wpipe")`` elsewhere would be a
second list of what each schedule does, which a newly registered schedule would not join.
This test reads every module of ``src/pipeweave`` with :mod:`ast` and fails on any
comparison (``==``, ``!=``, ``in``, ``not in``, ``match`` cases) against a string that names a
registered schedule, outside ``src/pipeweave/schedules/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pipeweave.schedules import available_schedules

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pipeweave"


def _strings(node: ast.AST) -> list[str]:
    """The string constants ``node`` is, or holds as a literal tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def name_tests(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` for each comparison in ``source`` against one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides: list[ast.AST] = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            sides = [node.value]
        else:
            continue
        found += [(node.lineno, s) for side in sides for s in _strings(side) if s in names]
    return found


def test_the_scan_sees_every_form_of_name_test() -> None:
    names = {"avgpipe", "2bw", "wpipe"}
    source = ("a = x == 'avgpipe'\nb = 'avgpipe' != y\nc = z in ('2bw', 'wpipe')\n"
              "match w:\n    case 'wpipe':\n        pass\nd = x == 'gpipe'\n")
    assert sorted(name_tests(source, names)) == [(1, "avgpipe"), (2, "avgpipe"), (3, "2bw"),
                                                 (3, "wpipe"), (5, "wpipe")]


def test_no_module_outside_schedules_tests_a_schedule_name() -> None:
    names = {info.name for info in available_schedules()}
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name!r}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if "schedules" not in path.relative_to(PACKAGE).parts
             for line, name in name_tests(path.read_text(), names)]
    assert not found, ("schedule names tested outside schedules/ (declare the fact on the "
                       "registry entry and ask it instead):\n" + "\n".join(found))
