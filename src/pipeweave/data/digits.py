"""scikit-learn's bundled 8x8 handwritten digits (1,797 images), as tensors.

``load_digits()`` ships inside scikit-learn, so nothing is downloaded.  Pixels (0..16) are
scaled to [0, 1] and flattened to 64 features; labels are int64 in 0..9.  A fixed permutation
(independent of any user seed) puts 20 % of the images in the ``"test"`` split.  Shuffled
batches are drawn by :func:`pipeweave.data.build_dataset`.
"""

from __future__ import annotations

import functools
import importlib

import torch
from torch import Tensor

__all__ = ["TEST_FRACTION", "load_digits_split"]

TEST_FRACTION = 0.2
"""Fraction of the images held out as the ``"test"`` split."""

_SPLIT_SEED = 0  # fixed so the train/test membership never depends on the user's seed


def _require_sklearn() -> None:
    try:
        importlib.import_module("sklearn.datasets")
    except ImportError as exc:
        raise ImportError(
            "the 'digits' dataset needs scikit-learn; install it with `pip install scikit-learn`"
        ) from exc


@functools.lru_cache(maxsize=1)
def _load_all() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float64) / 16.0  # [1797, 64] in [0, 1]
    y = torch.as_tensor(bunch.target, dtype=torch.int64)  # [1797]
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
