"""Reading the files a user names (a plan, a profile, a transformers ``config.json``): one
place that turns every way a file cannot be read (missing, a folder, no permission, not text,
not JSON) into a one-line ``ValueError`` naming the file and the fix, instead of an
``IsADirectoryError`` traceback or a bare "'utf-8' codec can't decode byte 0xff".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_text", "read_json"]


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
