"""``pipeweave train --data PATH`` (text, .bin), ``--eval-every``, and resuming a run killed in
the middle of an epoch: the losses equal the uninterrupted run's."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeweave.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src"

# 40 lines of 52 bytes: 1976 training bytes, 123 windows of 16: an epoch is 30 steps of 4.
TEXT = "".join(f"line {i:02d}: the quick brown fox jumps over the lazy dog\n" for i in range(40))
COMMON = ["train", "--model", "gpt-tiny", "--batch-size", "4", "--seq-len", "16",
          "--no-progress", "--timeout", "60"]


@pytest.fixture(params=["txt", "bin"])
def corpus(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "txt":
        path = tmp_path / "corpus.txt"
        path.write_text(TEXT, encoding="utf-8")
    else:  # as nanoGPT's prepare.py writes it
        path = tmp_path / "corpus.bin"
        np.frombuffer(TEXT.encode(), dtype=np.uint8).astype(np.uint16).tofile(path)
    return path


def _metrics(directory: Path) -> list[dict[str, str]]:
    with open(directory / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _losses(directory: Path) -> list[float]:
    return [float(row["loss"]) for row in _metrics(directory)]


@pytest.mark.timeout(300)
def test_both_executors_train_on_the_file_alike_with_held_out_loss(corpus: Path,
                                                                  tmp_path: Path) -> None:
    runs = {}
    for executor in ("local", "processes"):
        out = tmp_path / executor
        assert main([*COMMON, "--data", str(corpus), "--steps", "4", "--eval-every", "2",
                     "--executor", executor, "--output-dir", str(out)]) == 0
        runs[executor] = _metrics(out)
    assert runs["local"] == [{**row, "time_s": r["time_s"]}
                             for row, r in zip(runs["processes"], runs["local"])]
    rows = runs["local"]
    assert [bool(row["eval_loss"]) for row in rows] == [False, True, False, True]
    assert all(0 < float(row["eval_loss"]) < 7 for row in rows if row["eval_loss"])
    summary = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert summary["eval_losses"] == {"2": float(rows[1]["eval_loss"]),
                                      "4": float(rows[3]["eval_loss"])}


def test_own_data_trains_differently_from_the_built_in_corpus(corpus: Path,
                                                             tmp_path: Path) -> None:
    common = [*COMMON, "--steps", "2", "--executor", "local"]
    assert main([*common, "--output-dir", str(tmp_path / "builtin")]) == 0
    assert main([*common, "--data", str(corpus), "--output-dir", str(tmp_path / "own")]) == 0
    assert _losses(tmp_path / "builtin") != _losses(tmp_path / "own")


def test_hf_model_trains_on_a_text_file_with_held_out_loss_in_tensorboard(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    assert main([*COMMON, "--model", "hf-gpt2", "--data", str(path), "--steps", "2",
                 "--executor", "local", "--eval-every", "1", "--tensorboard",
                 "--output-dir", str(tmp_path / "out")]) == 0
    rows = _metrics(tmp_path / "out")
    assert all(row["eval_loss"] for row in rows)
    assert f"held-out loss  {float(rows[1]['eval_loss']):.4f} (step 2)" in capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/eval_loss")] == [1, 2]


def test_resumed_in_the_middle_of_an_epoch_local(corpus: Path, tmp_path: Path) -> None:
    common = [*COMMON, "--data", str(corpus), "--executor", "local", "--eval-every", "3"]
    assert main([*common, "--steps", "8", "--output-dir", str(tmp_path / "straight")]) == 0
    assert main([*common, "--steps", "5", "--checkpoint-every", "5",
                 "--output-dir", str(tmp_path / "first")]) == 0
    assert main([*common, "--steps", "8", "--resume", str(tmp_path / "first" / "checkpoints"),
                 "--output-dir", str(tmp_path / "second")]) == 0
    assert _losses(tmp_path / "second") == _losses(tmp_path / "straight")
    straight, second = _metrics(tmp_path / "straight"), _metrics(tmp_path / "second")
    assert second[5]["eval_loss"] == straight[5]["eval_loss"] != ""  # step 6, after resuming


@pytest.mark.timeout(300)
def test_rank_killed_in_the_middle_of_an_epoch_then_resumed(tmp_path: Path) -> None:
    path = tmp_path / "corpus.bin"
    np.frombuffer(TEXT.encode(), dtype=np.uint8).astype(np.uint16).tofile(path)
    common = [*COMMON, "--data", str(path), "--steps", "6"]
    assert main([*common, "--output-dir", str(tmp_path / "straight")]) == 0
    checkpoints = tmp_path / "checkpoints"
    # In a process of its own: ranks started from this one may come from a fork server that
    # an earlier run started, without the variable.
    env = {**os.environ, "PYTHONPATH": str(SRC), "PIPEWEAVE_INJECT_FAULT": "rank=1,step=5"}
    killed = subprocess.run([sys.executable, "-m", "pipeweave", *common, "--checkpoint-every",
                             "2", "--checkpoint-dir", str(checkpoints),
                             "--output-dir", str(tmp_path / "killed")],
                            env=env, capture_output=True, text=True, timeout=240)
    assert killed.returncode != 0 and "rank 1" in killed.stderr, killed.stderr[-2000:]
    assert main([*common, "--resume", str(checkpoints),
                 "--output-dir", str(tmp_path / "resumed")]) == 0
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    # The newest complete checkpoint: after step 4, or after step 2 if rank 1's writer had not
    # finished step 4's shard (written in the background) when it died; both mid-epoch.
    assert summary["first_step"] in (2, 4)
    assert _losses(tmp_path / "resumed") == _losses(tmp_path / "straight")


def _bad(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    if name == "empty.txt":
        path.write_text("")
    elif name == "latin1.txt":
        path.write_bytes("café".encode("latin-1") * 100)
    elif name == "big.bin":
        np.array([1, 2, 300] * 100, dtype=np.uint16).tofile(path)
    elif name == "short.bin":
        np.arange(10, dtype=np.uint16).tofile(path)
    elif name == "small.txt":
        path.write_text("x" * 200)
    elif name == "ok.txt":
        path.write_text(TEXT)
    elif name == "folder":
        path.mkdir()
    elif name == "locked.txt":
        path.write_text(TEXT)
        path.chmod(0)
    return path


@pytest.mark.parametrize(("name", "extra", "message"), [
    ("empty.txt", [], "is empty; give a file with text or token ids"),
    ("latin1.txt", [], "not UTF-8 text"),
    ("big.bin", [], "holds token id 300 but the model's vocabulary has 256 ids"),
    ("short.bin", [], "has 10 tokens, too few for one sample of --seq-len 16"),
    ("small.txt", ["--eval-every", "2"], "held-out split (last 5 %) has 10 tokens, too few"),
    ("missing.txt", [], "no such file or folder"),
    ("locked.txt", [], "cannot be read"),
    ("folder", [], "the folder holds no files"),
    ("small.txt", ["--model", "mlp"], "--data trains language models, and mlp is not one"),
    ("big.bin", ["--tokenizer", "tok"], "--tokenizer applies to text"),
    ("small.txt", ["--data-dtype", "uint32"], "--data-dtype applies to a .bin --data"),
    ("ok.txt", ["--eval-every", "2", "--schedule", "pipedream"],
     "--eval-every needs the weights after a step"),
])
def test_bad_data_is_one_line_before_launch(name: str, extra: list[str], message: str,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad(tmp_path, name)
    if name == "locked.txt" and os.access(path, os.R_OK):
        pytest.skip("this user reads any file (root)")
    model = [] if "--model" in extra else ["--model", "gpt-tiny", "--seq-len", "16"]
    assert main(["train", "--batch-size", "4", *model, "--data", str(path), "--steps", "2", *extra,
                 "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: ") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", [["--eval-every", "2"], ["--tokenizer", "x"],
                                  ["--data-dtype", "uint32"]])
def test_data_options_without_data_are_refused(flag: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMMON, "--steps", "1", *flag, "--output-dir", str(tmp_path / "out")]) == 2
    assert f"{flag[0]} applies to --data only" in capsys.readouterr().err


def test_text_through_a_local_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted(set(TEXT.replace(":", " ").split())) + [":"]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    common = [*COMMON, "--data", str(path), "--steps", "2", "--executor", "local"]
    assert main([*common, "--tokenizer", str(tmp_path / "tok"), "--eval-every", "2",
                 "--output-dir", str(tmp_path / "tok-run")]) == 0
    assert main([*common, "--output-dir", str(tmp_path / "bytes")]) == 0
    assert _losses(tmp_path / "tok-run") != _losses(tmp_path / "bytes")
    assert _metrics(tmp_path / "tok-run")[1]["eval_loss"]
