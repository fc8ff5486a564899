"""Named datasets as endless, resumable streams of ``(inputs, targets)`` batches.

Batch ``k`` of a :class:`BatchStream` is a pure function of ``(dataset, split, batch_size,
seq_len, seed, k)``: every batch draws from its own generator seeded by mixing ``seed`` with
``k`` (or with the epoch number, for shuffled finite datasets).  The stream's whole state is
therefore the number of batches drawn, which is what ``state_dict()`` records, and resuming
from it reproduces the next batch exactly without replaying earlier ones.

Datasets (``available_datasets()``):

* ``"stdlib-bytes"`` -- next-byte prediction on the Python stdlib sources; int64 ``[B, T]``
  inputs and targets (targets shifted by one).  ``seq_len`` defaults to 64.
* ``"stdlib-bytes-labels"`` -- the same windows' first ``T`` bytes as both inputs and targets:
  the labels convention of Hugging Face causal LMs, whose loss does the shift itself.
* ``"digits"`` -- scikit-learn's 8x8 digits; float ``[B, 64]`` inputs, int64 ``[B]`` labels,
  reshuffled every epoch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor

from pipeweave.data.digits import load_digits_split
from pipeweave.data.stdlib_corpus import corpus_split, load_stdlib_bytes, sample_lm_batch

__all__ = ["DEFAULT_SEQ_LEN", "SEQUENCE_DATASETS", "BatchStream", "available_datasets",
           "build_dataset", "epoch_rows"]

Batch = tuple[Tensor, Tensor]

DEFAULT_SEQ_LEN = 64
"""``seq_len`` used for sequence datasets when none is given (``gpt-tiny``'s context)."""

SEQUENCE_DATASETS = frozenset({"stdlib-bytes", "stdlib-bytes-labels"})
"""Datasets whose samples are token sequences (they take ``seq_len``)."""

_SPLITS = ("train", "test")


def _mix_seed(seed: int, index: int) -> int:
    """A distinct 63-bit generator seed per ``(seed, index)`` (splitmix64 finaliser), so
    neighbouring seeds or indices give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


def epoch_rows(index: int, *, batch_size: int, rows: int, seed: int) -> Tensor:
    """The rows (of ``rows``) in batch ``index`` when every epoch visits all rows once in its
    own order: batch k covers positions ``[k*B, (k+1)*B)`` of ``perm(epoch 0) ++ perm(epoch 1)
    ++ ...``, ``perm(e)`` seeded by ``(seed, e)``, so batch k needs no earlier batch (a stream
    resumes in the middle of an epoch from its position alone)."""
    positions = torch.arange(index * batch_size, (index + 1) * batch_size)
    epochs = positions // rows
    chosen = torch.empty(batch_size, dtype=torch.int64)
    for epoch in sorted(set(epochs.tolist())):
        in_epoch = epochs == epoch
        chosen[in_epoch] = _epoch_order(seed, epoch, rows)[positions[in_epoch] % rows]
    return chosen


@functools.lru_cache(maxsize=2)
def _epoch_order(seed: int, epoch: int, rows: int) -> Tensor:
    """Epoch ``epoch``'s permutation of ``rows`` (cached: a corpus of millions of windows
    would otherwise draw it again for every batch; do not modify it)."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(_mix_seed(seed, epoch)))


class BatchStream:
    """An endless, deterministic iterator of ``(inputs, targets)`` batches that can resume.

    Iterating advances :attr:`position`; ``state_dict()``/``load_state_dict()`` save and
    restore it, and ``batch_at(k)`` returns batch ``k`` without moving.
    """

    def __init__(
        self,
        make_batch: Callable[[int], Batch],
        *,
        name: str,
        split: str,
        batch_size: int,
        seq_len: int | None,
        seed: int,
    ) -> None:
        self._make_batch = make_batch
        self._identity: dict[str, str | int | None] = {
            "dataset": name,
            "split": split,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "seed": seed,
        }
        self._position = 0

    @property
    def name(self) -> str:
        """The dataset's name."""
        return str(self._identity["dataset"])

    @property
    def position(self) -> int:
        """Number of batches drawn so far (the index of the next batch)."""
        return self._position

    def batch_at(self, index: int) -> Batch:
        """Batch number ``index`` of this stream, without changing :attr:`position`."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"batch index {index!r} is invalid; pass an int >= 0")
        return self._make_batch(index)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self._make_batch(self._position)
        self._position += 1
        return batch

    def state_dict(self) -> dict[str, str | int | None]:
        """The stream's identity and position; pass it to ``load_state_dict`` to resume."""
        return {**self._identity, "position": self._position}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Resume from ``state_dict()`` output; rejects state saved by a different stream."""
        for key, expected in self._identity.items():
            if key in state and state[key] != expected:
                raise ValueError(
                    f"state_dict has {key}={state[key]!r} but this stream has {key}={expected!r}; "
                    f"build the stream with the same settings before loading its state"
                )
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(
                f"state_dict position={position!r} is invalid; expected the int >= 0 "
                f"written by BatchStream.state_dict()"
            )
        self._position = position

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.state_dict().items())
        return f"BatchStream({fields})"


def _stdlib_bytes(
    *, batch_size: int, seq_len: int | None, seed: int, dtype: torch.dtype, split: str
) -> tuple[Callable[[int], Batch], int]:
    del dtype  # token ids are always int64
    t = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    data = corpus_split(load_stdlib_bytes(), split)

    def make_batch(index: int) -> Batch:
        gen = torch.Generator().manual_seed(_mix_seed(seed, index))
        return sample_lm_batch(data, batch_size=batch_size, seq_len=t, generator=gen)

    make_batch(0)  # fail now, not at the first next(), if the split is too short for seq_len
    return make_batch, t


def _stdlib_bytes_labels(
    *, batch_size: int, seq_len: int | None, seed: int, dtype: torch.dtype, split: str
) -> tuple[Callable[[int], Batch], int]:
    shifted, t = _stdlib_bytes(batch_size=batch_size, seq_len=seq_len, seed=seed, dtype=dtype,
                               split=split)

    def make_batch(index: int) -> Batch:
        inputs, _ = shifted(index)
        return inputs, inputs.clone()

    return make_batch, t


def _digits(
    *, batch_size: int, seq_len: int | None, seed: int, dtype: torch.dtype, split: str
) -> tuple[Callable[[int], Batch], int | None]:
    if seq_len is not None:
        raise ValueError(
            f"dataset 'digits' has no sequence dimension but got seq_len={seq_len}; "
            f"pass seq_len=None"
        )
    if not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is not a floating dtype; pass e.g. torch.float32")
    features, labels = load_digits_split(split, dtype=dtype)
    n = len(labels)

    def make_batch(index: int) -> Batch:
        rows = epoch_rows(index, batch_size=batch_size, rows=n, seed=seed)
        return features[rows], labels[rows]

    return make_batch, None


_DATASETS = {"stdlib-bytes": _stdlib_bytes, "stdlib-bytes-labels": _stdlib_bytes_labels,
             "digits": _digits}


def available_datasets() -> list[str]:
    """Names accepted by :func:`build_dataset`, sorted."""
    return sorted(_DATASETS)


def build_dataset(
    name: str,
    *,
    batch_size: int,
    seq_len: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    split: str = "train",
) -> BatchStream:
    """An endless deterministic stream of ``(inputs, targets)`` batches from dataset ``name``.

    ``dtype`` applies to floating inputs (digits features); token ids stay int64.
    """
    factory = _DATASETS.get(name)
    if factory is None:
        raise ValueError(f"unknown dataset {name!r}; choose one of {available_datasets()}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid; pass an int >= 1")
    if seq_len is not None and (
        isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1
    ):
        raise ValueError(f"seq_len={seq_len!r} is invalid; pass an int >= 1 or None")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed={seed!r} is not an int; pass e.g. seed=0")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype={dtype!r} is not a torch.dtype; pass e.g. torch.float32")
    if split not in _SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {list(_SPLITS)}")
    make_batch, effective_seq_len = factory(
        batch_size=batch_size, seq_len=seq_len, seed=seed, dtype=dtype, split=split
    )
    return BatchStream(
        make_batch,
        name=name,
        split=split,
        batch_size=batch_size,
        seq_len=effective_seq_len,
        seed=seed,
    )
