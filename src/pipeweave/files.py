"""Reading the files a user names (a plan, a profile, a transformers ``config.json``): one
place that turns every way a file cannot be read (missing, a folder, no permission, not text,
not JSON) into a one-line ``ValueError`` naming the file and the fix, instead of an
``IsADirectoryError`` traceback or a bare "'utf-8' codec can't decode byte 0xff".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_text", "read_json", "check_can_write"]


def read_text(path: str | Path, *, what: str, fix: str) -> str:
    """The text of ``path``; ``what`` names it in the message (``"plan file x.json"``,
    ``"--hf-config x.json"``), ``fix`` says what to give instead."""
    file = Path(path)
    if not file.exists():
        problem = "no such file"
    elif file.is_dir():
        problem = "a folder, not a file"
    else:
        try:
            return file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problem = "not a text file (not UTF-8)"
        except OSError as error:
            problem = f"cannot be read ({error.strerror or error})"
    raise ValueError(f"{what}: {problem}; {fix}")


def read_json(path: str | Path, *, what: str, fix: str) -> Any:
    """The JSON value in ``path`` (see :func:`read_text`); invalid JSON says where."""
    text = read_text(path, what=what, fix=fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what}: not valid JSON ({error}); {fix}") from None


def check_can_write(path: str | Path, flag: str) -> None:
    """Refuse, before any work and without creating anything, an output file ``path`` that
    could not be written: a folder, or a place under a file or a folder without write
    permission (its missing folders are created when it is written)."""
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"{flag} {file} is a folder; give a file name, e.g. {file / 'out'}")
    existing = next(p for p in (file.parent, *file.parent.parents) if p.exists() or p == Path())
    if not existing.is_dir():
        raise ValueError(f"{flag} {file} cannot be written: {existing} is a file, not a "
                         f"folder; give another path")
    if not os.access(existing, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ValueError(f"{flag} {file} cannot be written (permission denied); give a path "
                         f"you can write to")
