"""Checkpoints on disk: a folder per checkpoint, a shard per rank, a manifest written last.

Layout of a checkpoint directory ``DIR``::

    DIR/
      latest                        "step-00000004-3f2a9c1e" (replaced atomically, only forward)
      step-00000002-3f2a9c1e/       the checkpoint after 2 steps, written by run 3f2a9c1e
        rank0.pt   rank1.pt         one shard per rank: torch.save of tensors and plain data
        rank0.json rank1.json       each rank's record of its shard (sha256, bytes, blocks)
        MANIFEST.json               the union of the records; written last
      step-00000004-3f2a9c1e/

Why a crash can never leave a partial checkpoint that looks complete (PipeDream §4 writes each
stage's checkpoint locally with no global coordination; this keeps that, and adds the proof
of completeness the paper leaves implicit):

* every file is written to a temporary name, flushed, ``fsync``-ed and then renamed
  (``os.replace`` is atomic), so a file with its final name is whole;
* a rank writes its record only after its shard is in place; the manifest is written only
  when all ``world_size`` records are present, by the rank that finishes last (it checks
  after its own rename, so at least one rank sees every record);
* ``latest`` moves only after the manifest exists, and only forward (if a run dies between
  the two, resuming the directory still takes the newest complete checkpoint);
* every checkpoint gets a fresh folder (step and run id), so writing one never touches a
  complete one — a crash mid-write leaves the previous checkpoint as it was.

Loading checks the manifest, each shard's size and sha256, and reads shards with
``torch.load(weights_only=True)``: only tensors and plain containers, never arbitrary pickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

__all__ = ["CheckpointError", "StoredCheckpoint", "write_shard", "finalize", "resolve",
           "find_resume", "complete_checkpoints", "verified_checkpoints", "step_folder",
           "sha256_of", "FORMAT", "MANIFEST", "LATEST"]

FORMAT = "pipeweave-checkpoint"
VERSION = 1
MANIFEST = "MANIFEST.json"
LATEST = "latest"
OUTPUT_SUBFOLDER = "checkpoints"
"""Where ``pipeweave train`` keeps checkpoints inside its output folder by default; resuming
an output folder looks there."""
_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, damaged, or does not fit the run."""


# -- writing -------------------------------------------------------------------------------
def step_folder(root: str | Path, step: int, run_id: str) -> Path:
    """The folder of the checkpoint taken after ``step`` steps by run ``run_id``."""
    return Path(root) / f"step-{step:08d}-{run_id}"


def _step_of(name: str) -> int | None:
    parts = name.split("-")
    if len(parts) != 3 or parts[0] != "step" or not parts[1].isdigit():
        return None
    return int(parts[1])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def write_shard(folder: Path, rank: int, payload: Mapping[str, Any], record: Mapping[str, Any],
                *, serialized: Callable[[], None] | None = None) -> dict[str, Any]:
    """Write ``rank``'s shard and then its record; return the record as written.

    ``serialized`` is called as soon as the payload's tensors have been copied out (before
    the ``fsync``): from then on the caller may change them.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.pt"
    tmp = _temporary(path)
    with open(tmp, "wb") as handle:
        writer = _HashingWriter(handle)
        torch.save(dict(payload), writer)  # type: ignore[arg-type]  # any .write() works
        if serialized is not None:
            serialized()
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    full = {**record, "rank": rank, "file": path.name, "sha256": writer.digest.hexdigest(),
            "bytes": writer.size}
    _atomic_write(folder / f"rank{rank}.json", json.dumps(full, sort_keys=True).encode())
    return full


def _check_tied_copies(folder: Path, records: list[dict[str, Any]]) -> None:
    """Every copy of a tied parameter split over stages (``record["tied"]``, per parallel
    pipeline: name -> the first use's name and the copy's sha256) holds the same bytes: the
    checkpoint stores the weight once, so copies that drifted apart must not pass silently."""
    for pipeline in range(max((len(r.get("tied", [])) for r in records), default=0)):
        seen: dict[str, tuple[str, str]] = {}
        for record in records:
            held = record["tied"][pipeline] if pipeline < len(record.get("tied", [])) else {}
            for name, info in held.items():
                first = seen.setdefault(info["of"], (name, info["sha256"]))
                if first[1] != info["sha256"]:
                    raise CheckpointError(
                        f"checkpoint {folder}: the copies {first[0]} and {name} of tied parameter "
                        f"{info['of']} differ (pipeline {pipeline}); they must stay identical, "
                        f"which is a bug in pipeweave's tied-gradient sum: please report it")


def finalize(folder: Path, world_size: int) -> bool:
    """Write the manifest if every rank's record is present; move ``latest`` forward.

    Returns whether the checkpoint is now complete. Safe to call from several ranks at once:
    they write the same manifest, each through its own temporary file.
    """
    records = []
    for rank in range(world_size):
        path = folder / f"rank{rank}.json"
        if not path.exists():
            return False
        records.append(json.loads(path.read_text()))
    first = records[0]
    for record in records[1:]:
        if record["common"] != first["common"] or record["step"] != first["step"]:
            raise CheckpointError(f"ranks disagree on what checkpoint {folder} is; records "
                                  f"rank0.json and rank{record['rank']}.json differ")
    _check_tied_copies(folder, records)
    parameters: dict[str, dict[str, Any]] = {}
    for record in records:
        for name, info in record["parameters"].items():
            assert name not in parameters, f"parameter {name} written by two ranks"
            parameters[name] = {**info, "file": record["file"]}
    manifest = {
        "format": FORMAT, "version": VERSION, "step": first["step"], "run_id": first["run_id"],
        "world_size": world_size, "created_unix": time.time(), **first["common"],
        "shards": [{k: r[k] for k in ("rank", "file", "sha256", "bytes", "blocks", "has_losses")}
                   for r in records],
        "parameters": parameters,
    }
    _atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    _advance_latest(folder.parent, folder.name)
    return True


def _advance_latest(root: Path, name: str) -> None:
    step = _step_of(name)
    pointer = root / LATEST
    try:
        current = _step_of(pointer.read_text().strip())
    except FileNotFoundError:
        current = None
    if current is not None and step is not None and current > step:
        return
    _atomic_write(pointer, (name + "\n").encode())


# -- finding -------------------------------------------------------------------------------
def complete_checkpoints(root: str | Path) -> list[Path]:
    """Folders under ``root`` that hold a manifest, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir()
             if (step := _step_of(p.name)) is not None and (p / MANIFEST).is_file()]
    return [p for _, p in sorted(found)]


def verified_checkpoints(root: str | Path, *, exclude: Path | None = None,
                         limit: int = 3) -> list[Path]:
    """Up to ``limit`` complete checkpoints under ``root`` (not ``exclude``) whose manifest
    reads and whose shards all match their size and sha256, newest first: the ones it is
    safe to recommend."""
    found: list[Path] = []
    for folder in reversed(complete_checkpoints(root)):
        if len(found) == limit:
            break
        if folder == exclude:
            continue
        try:
            StoredCheckpoint(folder, suggest=False)
        except CheckpointError:
            continue
        found.append(folder)
    return found


def _alternatives(root: Path, exclude: Path) -> str:
    """The way out of a checkpoint that cannot be used: the others that verify, or none."""
    others = verified_checkpoints(root, exclude=exclude)
    if not others:
        return (f"no other checkpoint in {root} verifies; start afresh without --resume (and "
                f"with a new --checkpoint-dir to keep these folders apart)")
    listed = ", ".join(str(p) for p in others)
    return f"checkpoints that verify, to resume from instead (newest first): {listed}"


def resolve(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names: itself, or the newest complete one in it.

    In a directory, ``latest`` names the checkpoint unless a complete checkpoint of a later
    step exists (the pointer lags when a run dies between a manifest and the pointer's move).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; pass a checkpoint directory "
                              f"(--checkpoint-dir of an earlier run) or one step-* folder in it")
    if (path / MANIFEST).is_file():
        return path
    if _step_of(path.name) is not None:
        raise CheckpointError(
            f"checkpoint {path} is incomplete (no {MANIFEST}): it was being written when its "
            f"run stopped; {_alternatives(path.parent, path)}")
    pointer = path / LATEST
    if pointer.is_file():
        target = path / pointer.read_text().strip()
        if not (target / MANIFEST).is_file():
            raise CheckpointError(f"{pointer} names {target.name}, which is not a complete "
                                  f"checkpoint; {_alternatives(path, target)}")
        # A crash between writing a manifest and moving the pointer leaves the pointer one
        # checkpoint behind; the newer complete checkpoint is the one to continue from.
        newest = complete_checkpoints(path)[-1]
        if (_step_of(newest.name) or 0) > (_step_of(target.name) or 0):
            return newest
        return target
    complete = complete_checkpoints(path)
    if complete:
        return complete[-1]
    nested = path / OUTPUT_SUBFOLDER
    if nested.is_dir() and (complete_checkpoints(nested) or (nested / LATEST).is_file()):
        return resolve(nested)  # a run's output folder: its checkpoints live in there
    raise CheckpointError(f"{path} holds no complete checkpoint (no step-* folder with a "
                          f"{MANIFEST}); start without --resume")


def find_resume(root: str | Path) -> Path | None:
    """For ``resume="auto"``: the checkpoint to continue from, or None to start afresh."""
    root = Path(root)
    if not (root / LATEST).is_file() and not complete_checkpoints(root):
        return None
    return resolve(root)


# -- reading -------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class StoredCheckpoint:
    """A complete checkpoint folder: its manifest, and its shards loaded on demand."""

    def __init__(self, folder: str | Path, *, verify: bool = True, suggest: bool = True) -> None:
        """Read the manifest; check every shard's presence and size (and sha256 if ``verify``).
        ``suggest``: a refusal names the other checkpoints that verify (checking them)."""
        self.folder = Path(folder)
        self._suggest = suggest
        path = self.folder / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{self.folder} is not a complete checkpoint (no {MANIFEST})"
                                  f"{self._way_out()}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise self._damaged(f"its {MANIFEST} is not valid JSON ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise self._damaged(f"its {MANIFEST} is not a {FORMAT} manifest")
        if manifest.get("version") != VERSION:
            raise CheckpointError(f"checkpoint {self.folder} has format version "
                                  f"{manifest.get('version')}; this pipeweave reads version {VERSION}")
        self.manifest: dict[str, Any] = manifest
        self.step: int = int(manifest["step"])
        self.shards: dict[str, dict[str, Any]] = {s["file"]: s for s in manifest["shards"]}
        self._verified: set[str] = set()
        for name, shard in self.shards.items():
            self._check(name, shard, digest=verify)

    def _damaged(self, problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.folder} is damaged: {problem}. It cannot be "
                               f"used{self._way_out()}")

    def _way_out(self) -> str:
        return f"; {_alternatives(self.folder.parent, self.folder)}" if self._suggest else ""

    def _check(self, name: str, shard: Mapping[str, Any], *, digest: bool) -> None:
        path = self.folder / name
        blocks = shard.get("blocks") or []
        owner = f"rank {shard['rank']}'s shard {name}" + (
            f" (blocks {min(blocks)}..{max(blocks)})" if blocks else "")
        if not path.is_file():
            raise self._damaged(f"{owner} is missing")
        size = path.stat().st_size
        if size != shard["bytes"]:
            raise self._damaged(f"{owner} has {size} bytes but the manifest says "
                                f"{shard['bytes']} (truncated or overwritten)")
        if digest and name not in self._verified:
            if sha256_of(path) != shard["sha256"]:
                raise self._damaged(f"{owner} does not match its sha256 checksum (corrupted)")
            self._verified.add(name)

    def load(self, name: str) -> dict[str, Any]:
        """Shard ``name`` (checksum verified) as plain data; tensors are memory-mapped."""
        self._check(name, self.shards[name], digest=True)
        try:
            data = torch.load(self.folder / name, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # weights_only refuses anything but tensors and plain data
            raise self._damaged(f"shard {name} cannot be read safely ({_refusal(error)}); "
                                f"pipeweave writes tensors and plain data only, so it was not "
                                f"written by pipeweave or was altered, and must not be loaded "
                                f"with a full unpickler") from None
        if not isinstance(data, dict):
            raise self._damaged(f"shard {name} does not hold a mapping")
        return data

    def file_of(self, parameter: str) -> str:
        return str(self.manifest["parameters"][parameter]["file"])


def _refusal(error: Exception) -> str:
    """What torch's loader refused, without its advice to retry with ``weights_only=False``
    (which would run whatever the file's pickle says)."""
    for line in str(error).splitlines():
        line = line.split("WeightsUnpickler error:", 1)[-1].strip().rstrip(".")
        if line and not any(word in line for word in ("weights_only", "torch.load", "PyTorch")):
            return line
    return "it holds more than tensors and plain data"
