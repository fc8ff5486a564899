"""The examples run as documented."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_custom_model_example_trains_and_agrees() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_model.py")],
                         capture_output=True, text=True, timeout=170, check=True).stdout
    assert "agree exactly: True" in out
    first, last = (float(v) for v in out.split("loss ")[1].split(" over")[0].split(" -> "))
    assert last < first
