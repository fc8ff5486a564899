"""Packages whose public names load on first use (PEP 562's module ``__getattr__``).

``pipeweave.measure`` gathers modules that import torch and the runtime; a command that only
plans (``pipeweave auto --profile FILE``, ``--help``) needs none of them, but imports the
package to reach its torch-free parts (the defaults in ``measure.alternating``). With the names
loaded lazily, ``import pipeweave.measure`` costs nothing, and ``from pipeweave.measure import
calibrate`` imports the module that defines ``calibrate`` when it runs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``homes`` (name -> the submodule
    that defines it) imported from that submodule on first use, then kept on the package."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
