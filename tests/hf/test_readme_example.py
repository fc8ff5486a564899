"""The README's "Your Hugging Face model" example runs as written, in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your Hugging Face model", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_example_is_short_and_trains(tmp_path: Path) -> None:
    code = example()
    assert len(code.strip().splitlines()) <= 20
    assert "pipeweave.testing" not in code  # the example uses the public API only
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=240, env={"PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"[\d.]+", done.stdout.split("loss per step:")[1])]
    assert len(losses) == 5 and losses[-1] < losses[0]
