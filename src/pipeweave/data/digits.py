"""scikit-learn's bundled 8x8 handwritten digits (1,797 images), as tensors.

``load_digits()`` ships inside scikit-learn, so nothing is downloaded.  Pixels (0..16) are
scaled to [0, 1] and flattened to 64 features; labels are int64 in 0..9.  A fixed permutation
(independent of any user seed) puts 20 % of the images in the ``"test"`` split.  Shuffled
batches are drawn by :func:`pipeweave.data.build_dataset`.

The images are read from scikit-learn's own ``digits.csv.gz`` (exactly what ``load_digits``
reads) without importing scikit-learn: that import (scipy with it) costs seconds of CPU, and
every rank of every distributed run that trains on digits would pay it. ``load_digits`` is
the fallback where the file is not at its usual place.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import importlib.util
from pathlib import Path

import numpy as np

import torch
from torch import Tensor

__all__ = ["TEST_FRACTION", "load_digits_split"]

TEST_FRACTION = 0.2
"""Fraction of the images held out as the ``"test"`` split."""

_SPLIT_SEED = 0  # fixed so the train/test membership never depends on the user's seed


def _bundled_csv() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing scikit-learn
    (``find_spec`` of a top-level package does not run it); None where it is not there."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the 'digits' dataset needs scikit-learn; install it with `pip install scikit-learn`")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def _require_sklearn() -> None:
    _bundled_csv()


@functools.lru_cache(maxsize=1)
def _load_all() -> tuple[Tensor, Tensor]:
    path = _bundled_csv()
    if path is None:  # a scikit-learn that keeps its data elsewhere: let it read them
        bunch = importlib.import_module("sklearn.datasets").load_digits()
        pixels, labels = bunch.data, bunch.target
    else:  # 65 columns: 64 pixels, then the label (sklearn's load_digits reads it so)
        with gzip.open(path, "rt") as handle:
            table = np.loadtxt(handle, delimiter=",")
        pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    x = torch.as_tensor(pixels, dtype=torch.float64) / 16.0  # [1797, 64] in [0, 1]
    y = torch.as_tensor(labels, dtype=torch.int64)  # [1797]
    return x, y


def load_digits_split(
    split: str = "train", *, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Features ``[N, 64]`` in ``dtype`` (scaled to [0, 1]) and int64 labels ``[N]`` for the
    ``"train"`` or ``"test"`` split."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'test'")
    _require_sklearn()
    x, y = _load_all()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(_SPLIT_SEED))
    n_test = int(len(y) * TEST_FRACTION)
    rows = perm[n_test:] if split == "train" else perm[:n_test]
    return x[rows].to(dtype), y[rows].clone()
