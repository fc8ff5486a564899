"""Bad checkpoints are reported before training starts; a crash while writing never leaves a
partial checkpoint as the one to resume from, and the previous one still loads."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeweave.runtime import run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import (LATEST, MANIFEST, CheckpointError,
                                                StoredCheckpoint, complete_checkpoints, resolve,
                                                sha256_of, verified_checkpoints)

from checkpoint_jobs import assert_same_run, gpt_job, mlp_job, with_checkpoints

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """Checkpoints after steps 2 and 4 of an mlp run, and the 6-step uninterrupted results."""
    root = tmp_path_factory.mktemp("checkpoints")
    job = mlp_job(depth=2, steps=6)
    run_local(with_checkpoints(dataclasses.replace(job, steps=4), directory=str(root), every=2))
    return root, run_local(job)


def _copy(root: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(root, tmp_path / "copy")
    return tmp_path / "copy"


def _resume(root: Path, **fields):  # type: ignore[no-untyped-def]
    job = mlp_job(depth=2, steps=6)
    # Also asks for new checkpoints in the same directory: a refused resume must write none.
    options = CheckpointOptions(directory=str(root), every=1, resume=str(root))
    return run_local(dataclasses.replace(job, checkpoint=options, **fields))


def _newest_shard(root: Path, rank: int = 1) -> Path:
    return complete_checkpoints(root)[-1] / f"rank{rank}.pt"


def _refused(root: Path, match: str) -> None:
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(CheckpointError, match=match):
        _resume(root)
    assert sorted(p.name for p in root.iterdir()) == before  # nothing ran, nothing written


def _older_still_loads(root: Path, straight: list) -> None:
    older = complete_checkpoints(root)[0]
    assert older.name.startswith("step-00000002-")
    job = mlp_job(depth=2, steps=6)
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(older))))
    assert_same_run(resumed, straight, microbatches=4, steps=[3, 4, 5, 6])


def test_corrupted_shard_is_refused_and_the_older_checkpoint_still_loads(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    shard = _newest_shard(root)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the middle of the tensor bytes
    shard.write_bytes(bytes(data))
    _refused(root, r"step-00000004-\w+ is damaged: rank 1's shard rank1.pt \(blocks 2..3\) does "
                   r"not match its sha256 checksum \(corrupted\).*resume from instead.*step-00000002")
    _older_still_loads(root, written[1])


def _flip_a_bit(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the middle of the tensor bytes
    shard.write_bytes(bytes(data))


def test_with_both_checkpoints_damaged_neither_is_recommended(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    older, newest = complete_checkpoints(root)
    _flip_a_bit(older / "rank0.pt")
    _flip_a_bit(newest / "rank1.pt")
    messages = []
    for folder in (root, older, newest):  # the directory resolves to the newest
        with pytest.raises(CheckpointError) as caught:
            _resume(folder)
        messages.append(str(caught.value))
    for message in messages:
        assert "is damaged" in message and "resume from instead" not in message
        assert f"no other checkpoint in {root} verifies; start afresh without --resume" in message
    assert older.name not in messages[0] and older.name not in messages[2]  # newest's refusal
    assert newest.name not in messages[1]  # older's refusal
    assert verified_checkpoints(root) == []


def test_only_checkpoints_that_verify_are_recommended(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    older, newest = complete_checkpoints(root)
    _flip_a_bit(newest / "rank1.pt")
    with pytest.raises(CheckpointError, match=rf"{newest.name} is damaged.*checkpoints that "
                                              rf"verify, to resume from instead \(newest first\): "
                                              rf"{older}$"):
        _resume(older.parent)
    assert verified_checkpoints(root) == [older]
    assert verified_checkpoints(root, exclude=older) == []


def test_truncated_shard_is_refused(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    shard = _newest_shard(root, rank=0)
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size // 3)
    _refused(root, rf"rank 0's shard rank0.pt \(blocks 0..1\) has {size // 3} bytes but the "
                   rf"manifest says {size} \(truncated")
    _older_still_loads(root, written[1])


def test_missing_rank_shard_is_refused(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    _newest_shard(root).unlink()
    _refused(root, r"rank 1's shard rank1.pt \(blocks 2..3\) is missing")


def test_damaged_manifest_is_refused(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    (complete_checkpoints(root)[-1] / MANIFEST).write_text('{"format": "pipeweave-checkp')
    _refused(root, "MANIFEST.json is not valid JSON")


def test_checkpoint_of_another_model_is_refused(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    gpt = gpt_job(depth=2, steps=6)  # 6 blocks, not the mlp's 4
    with pytest.raises(CheckpointError, match=r"was written for another model \(4 blocks; this one "
                                              r"has 6\): it lacks \['0.pos.weight'.*it has \['0.0.bias'"):
        run_local(dataclasses.replace(gpt, checkpoint=CheckpointOptions(resume=str(root))))
    wider = dataclasses.replace(mlp_job(depth=2, steps=6),
                                model=dataclasses.replace(mlp_job(depth=2).model,
                                                          overrides={"hidden": 64}))
    with pytest.raises(CheckpointError, match=r"parameter 0.0.weight is float64\[128, 64\] there "
                                              r"but float64\[64, 64\] here"):
        run_local(dataclasses.replace(wider, checkpoint=CheckpointOptions(resume=str(root))))


def test_another_optimizer_is_refused(written, tmp_path) -> None:
    job = mlp_job(depth=2, steps=6)
    sgd = dataclasses.replace(job.optimizer, name="sgd", kwargs={"lr": 0.1})
    with pytest.raises(CheckpointError, match="written with optimizer Adam; this run uses SGD"):
        run_local(dataclasses.replace(job, optimizer=sgd,
                                      checkpoint=CheckpointOptions(resume=str(written[0]))))


class Payload:
    """Anything a pickle could construct: weights_only loading must refuse it."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("echo pwned",))


def test_shards_are_loaded_weights_only(written, tmp_path) -> None:
    root = _copy(written[0], tmp_path)
    folder = complete_checkpoints(root)[-1]
    shard = folder / "rank0.pt"
    torch.save({"parameters": {}, "evil": Payload()}, shard)
    manifest = json.loads((folder / MANIFEST).read_text())  # a consistent manifest, to be sure
    entry = next(s for s in manifest["shards"] if s["file"] == "rank0.pt")
    entry["sha256"], entry["bytes"] = sha256_of(shard), shard.stat().st_size
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="shard rank0.pt cannot be read safely") as caught:
        StoredCheckpoint(folder).load("rank0.pt")
    message = str(caught.value)
    assert "\n" not in message and "weights_only" not in message and "posix.system" in message
    assert "must not be loaded with a full unpickler" in message


def test_crash_between_shards_and_manifest_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    import pipeweave.runtime.checkpoint.store as store

    real = store._atomic_write

    def crash_at_step_4(path: Path, data: bytes) -> None:
        # Crash exactly where the manifest is written (every rank's shard is there by then);
        # patching finalize instead raced: a shard could appear between a check and the write.
        if path.name == MANIFEST and path.parent.name.startswith("step-00000004-"):
            raise OSError("disk full (simulated) while writing the manifest")
        real(path, data)

    monkeypatch.setattr(store, "_atomic_write", crash_at_step_4)
    job = mlp_job(depth=2, steps=6)
    with pytest.raises(OSError, match="disk full"):
        run_local(with_checkpoints(job, directory=str(tmp_path), every=2))
    monkeypatch.undo()
    (partial,) = tmp_path.glob("step-00000004-*")
    assert {p.name for p in partial.iterdir()} >= {"rank0.pt", "rank1.pt"}
    assert not (partial / MANIFEST).exists()
    assert (tmp_path / LATEST).read_text().startswith("step-00000002-")
    with pytest.raises(CheckpointError, match=r"is incomplete \(no MANIFEST.json\).*step-00000002"):
        resolve(partial)
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(tmp_path))))
    assert_same_run(resumed, run_local(job), microbatches=4, steps=[3, 4, 5, 6])


def test_a_lagging_latest_pointer_resumes_from_the_newest_complete_checkpoint(written, tmp_path) -> None:
    # A run killed after a manifest but before moving ``latest`` leaves the pointer behind.
    root = _copy(written[0], tmp_path)
    older, newest = complete_checkpoints(root)
    (root / LATEST).write_text(older.name + "\n")
    assert resolve(root) == newest
    job = mlp_job(depth=2, steps=6)
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(root))))
    assert_same_run(resumed, written[1], microbatches=4, steps=[5, 6])


@pytest.mark.timeout(120)
def test_sigkill_while_writing_a_shard_leaves_the_last_complete_checkpoint(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    done = subprocess.run([sys.executable, str(HERE / "crash_while_writing.py"), str(tmp_path), "5"],
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == -9, done.stdout + done.stderr  # killed by SIGKILL, mid-shard
    complete = complete_checkpoints(tmp_path)
    incomplete = [p for p in tmp_path.glob("step-*") if p not in complete]
    assert complete and incomplete  # the shard being written never became a checkpoint
    assert any(p.name.startswith(".rank") for folder in incomplete for p in folder.iterdir())
    latest = resolve(tmp_path)
    assert latest == complete[-1] and latest.name < min(p.name for p in incomplete)
    for folder in complete:
        StoredCheckpoint(folder, verify=True)  # every complete one is whole
    job = mlp_job(depth=2, steps=6)
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(tmp_path))))
    k = StoredCheckpoint(latest).step
    assert_same_run(resumed, run_local(job), microbatches=4, steps=list(range(k + 1, 7)))


def test_resuming_an_output_folder_takes_its_checkpoints_subfolder(written, tmp_path) -> None:
    # `pipeweave train --output-dir runs/w --checkpoint-every N` writes to runs/w/checkpoints;
    # `--resume runs/w` must find them there.
    import shutil

    output = tmp_path / "w"
    root = output / "checkpoints"
    shutil.copytree(written[0], root)
    assert resolve(output) == resolve(root) == complete_checkpoints(root)[-1]
