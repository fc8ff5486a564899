"""Each module of a package imported first, in a state with none of the package loaded.

Run as ``python import_first.py SRC PACKAGE``: prints ``ok`` and exits 0, or prints the
traceback of every module whose import fails when it comes first and exits 1. Used by
``tests/test_layers.py`` (no import cycle bites, whatever a program imports first).

Why forks rather than a loop that empties ``sys.modules`` before each module: importing
``a.b.c`` first imports ``a``, then ``a.b``, then ``a.b.c``: its first steps are exactly a
first import of its parent package. So one process imports a package first, and each child
module continues from that state in a fork of it (recursively), instead of every module
re-running its parents' and their dependencies' imports. A child the package's own import
already loaded needs no fork: importing it first is that same import. Modules outside the
package (torch, ...) are imported once beforehand and stay loaded, as they did in the loop.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import traceback
from pathlib import Path

__all__ = ["modules_of", "every_module_imports_first"]


def modules_of(src: Path, package: str) -> list[str]:
    """Every module and package under ``src/package``, by dotted name, sorted."""
    names = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
             for p in (src / package).rglob("*.py") if p.name != "__main__.py"}
    return sorted(names)


def _below(package: str, children: dict[str, list[str]]) -> bool:
    """In a process that has just imported ``package`` first: each child module imported
    next, each in a fork of this state. True when none failed."""
    ok = True
    for child in children.get(package, []):
        if child in sys.modules:
            continue
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(child)
                code = 0 if _below(child, children) else 1
            except BaseException:
                print(f"importing {child} first fails:", file=sys.stderr)
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        ok = os.waitpid(pid, 0)[1] == 0 and ok
    return ok


def every_module_imports_first(src: Path, package: str) -> bool:
    """True when every module of ``package`` imports first without error (see the module)."""
    modules = modules_of(src, package)
    for name in modules:  # what the package imports from outside it, loaded once
        try:
            importlib.import_module(name)
        except BaseException:
            pass  # reported below, where it is imported first
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    children: dict[str, list[str]] = {}
    for name in modules:
        children.setdefault(name.rpartition(".")[0], []).append(name)
    gc.freeze()  # fewer pages copied into each fork
    return _below("", children)


if __name__ == "__main__":
    root, name = Path(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, str(root))
    passed = every_module_imports_first(root, name)
    print("ok" if passed else "failed")
    sys.exit(0 if passed else 1)
