"""``--option KEY=VALUE``, read the same way by every command (``show``, ``simulate``,
``train``): ``true``/``false`` (any case) are booleans, then an integer, a float, JSON (a
list, an object, ``null``), else the text as it is. ``train --option vertical_sync=True`` and
``show --option vertical_sync=True`` mean the same."""

from __future__ import annotations

import json
from collections.abc import Iterable

__all__ = ["parse_option", "parse_options"]


def parse_option(text: str) -> tuple[str, object]:
    """``(key, value)`` of one ``KEY=VALUE`` (module docstring); ValueError naming the form."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"option {text!r} is not KEY=VALUE; write it like --option advance=2")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key.strip(), lowered == "true"
    for convert in (int, float):
        try:
            return key.strip(), convert(raw)
        except ValueError:
            continue
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def parse_options(texts: Iterable[str]) -> dict[str, object]:
    """Every ``--option`` of a command as one mapping (a later key wins)."""
    return dict(parse_option(text) for text in texts)
