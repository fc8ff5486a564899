"""The README's command blocks, for the tests that run them as written: the ``pipeweave``
lines of the first bash block under a heading, and the same lines with fewer steps."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def block_commands(heading: str) -> list[list[str]]:
    """The arguments after ``pipeweave`` of every line of the first ```` ```bash ```` block
    after ``## heading`` (comments dropped)."""
    section = README.read_text().split(f"## {heading}", 1)[1]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [shlex.split(line.split("#", 1)[0])[1:] for line in block.splitlines()
            if line.startswith("pipeweave ")]


def shortened(argv: list[str], divisors: Mapping[str, int]) -> list[str]:
    """``argv`` with each count flag in ``divisors`` divided by its divisor (fewer steps)."""
    out = list(argv)
    for flag, divisor in divisors.items():
        if flag in out:
            index = out.index(flag) + 1
            out[index] = str(int(out[index]) // divisor)
    return out
