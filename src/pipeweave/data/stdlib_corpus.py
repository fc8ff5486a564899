"""A byte-level language-modelling corpus built from this machine's Python standard library.

Nothing is downloaded: the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` are read in
sorted order (skipping ``site-packages`` and test directories), concatenated and capped at
``max_bytes``.  Tokens are raw bytes (vocabulary 256).  The last ``HELDOUT_FRACTION`` of the
bytes is the held-out split, so train and test never overlap::

    |<------------------- train (95 %) ------------------->|<- test (5 %) ->|

The corpus is identical for a given Python installation; a different Python version gives a
different (but equally deterministic) corpus.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_MAX_BYTES",
    "HELDOUT_FRACTION",
    "corpus_split",
    "load_stdlib_bytes",
    "sample_lm_batch",
    "stdlib_source_files",
]

DEFAULT_MAX_BYTES = 4_000_000
"""Default cap on the corpus size in bytes."""

HELDOUT_FRACTION = 0.05
"""Fraction of the corpus, taken from its end, that forms the held-out ``"test"`` split."""

_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """All ``.py`` files under ``root`` (default: the stdlib), sorted by relative path, with
    ``site-packages`` and test directories skipped."""
    base = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    if not base.is_dir():
        raise ValueError(f"corpus root {str(base)!r} is not a directory; pass root=<dir of .py>")
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


@functools.lru_cache(maxsize=4)
def _load(root: str | None, max_bytes: int) -> Tensor:
    chunks: list[bytes] = []
    total = 0
    for path in stdlib_source_files(root):
        if total >= max_bytes:
            break
        data = path.read_bytes()[: max_bytes - total]
        chunks.append(data)
        total += len(data)
    if total == 0:
        raise RuntimeError(
            f"found no .py source under {root or sysconfig.get_paths()['stdlib']!r}; this Python "
            f"may ship its stdlib zipped; pass root=<a directory of .py files>"
        )
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def load_stdlib_bytes(
    *, max_bytes: int = DEFAULT_MAX_BYTES, root: str | Path | None = None
) -> Tensor:
    """The whole corpus as a uint8 tensor of at most ``max_bytes`` bytes (cached; do not
    modify it in place)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes!r} is invalid; pass an int >= 1")
    return _load(None if root is None else str(root), max_bytes)


def corpus_split(data: Tensor, split: str) -> Tensor:
    """The ``"train"`` (first 95 %) or ``"test"`` (last 5 %) part of ``data``."""
    cut = len(data) - int(len(data) * HELDOUT_FRACTION)
    if split == "train":
        return data[:cut]
    if split == "test":
        return data[cut:]
    raise ValueError(f"unknown split {split!r}; choose 'train' or 'test'")


def sample_lm_batch(
    data: Tensor, *, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Sample ``batch_size`` windows uniformly from ``data``; returns int64 ``(x, y)`` of shape
    ``[batch_size, seq_len]`` with ``y[:, t] == x[:, t + 1]`` (next-byte targets)."""
    if len(data) < seq_len + 1:
        raise ValueError(
            f"corpus split has {len(data)} bytes, too few for seq_len={seq_len}; use a shorter "
            f"seq_len or a larger max_bytes"
        )
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(seq_len + 1)  # [B, T + 1]
    window = data[index].long()
    return window[:, :-1], window[:, 1:]
