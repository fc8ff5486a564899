"""``--precision`` on the command line: train and profile honour it, fp16 is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main

SMALL = ["--model", "gpt-tiny", "--batch-size", "8", "--steps", "2", "--executor", "local",
         "--no-progress"]
"""128 tokens per micro-batch: more than the attention block's widths (64), so bf16-mixed holds
less than float32 (with fewer tokens than a layer's width, autocast's bfloat16 weight copies,
one per micro-batch in flight, outweigh the saving: docs/precision.md)."""


def test_train_reports_precision_and_counted_memory(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    summaries = {}
    for precision in ("full", "bf16-mixed"):
        out = tmp_path / precision
        assert main(["train", *SMALL, "--precision", precision, "--output-dir", str(out)]) == 0
        summaries[precision] = json.loads((out / "summary.json").read_text())
    printed = capsys.readouterr().out
    assert "precision  bf16-mixed" in printed and "activations (MiB)" in printed
    full, mixed = summaries["full"], summaries["bf16-mixed"]
    assert mixed["precision"] == "bf16-mixed"
    assert all(0 < m < f for m, f in zip(mixed["peak_activation_bytes"],
                                         full["peak_activation_bytes"]))
    assert mixed["state_bytes"] == full["state_bytes"] and min(full["state_bytes"]) > 0


def test_profile_records_its_precision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "gpt-tiny", "--seq-len", "16", "--no-link", "--repeats",
                 "1", "--warmup", "0", "--precision", "bf16", "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)
    assert profile["metadata"]["precision"] == "bf16"


@pytest.mark.parametrize("command", ["train", "profile"])
def test_fp16_is_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", *SMALL] if command == "train" else ["profile", "--model", "gpt-tiny",
                                                         "--no-link"]
    assert main([*argv, "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --precision bf16-mixed" in err
