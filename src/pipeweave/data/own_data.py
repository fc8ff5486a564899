"""Training on a user's corpus (``pipeweave train --data PATH``): a resumable stream of
language-model batches from a text file, a folder of them or a token file.

The ids (:mod:`.token_files`) are split like the built-in corpus: the last
``HELDOUT_FRACTION`` (5 %) is the held-out ``"test"`` split. Each split is cut into windows
``seq_len`` tokens apart::

    ids:      |0 ......... T|T ........ 2T|2T ....... 3T| ...
    window i: inputs ids[iT : iT + T], targets ids[iT + 1 : iT + T + 1]

(with ``labels=True``, the Hugging Face convention, the targets are the inputs: the model's
loss shifts them). The training split visits every window once per epoch, each epoch in its
own order seeded by ``(seed, epoch)`` (:func:`~.registry.epoch_rows`); the held-out split is
read in order. Batch ``k`` is a pure function of ``k``, so a :class:`~.registry.BatchStream`
resumes in the middle of an epoch from its position alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .registry import Batch, BatchStream, epoch_rows
from .stdlib_corpus import HELDOUT_FRACTION
from .token_files import Tokens, check_utf8, open_tokens, text_files

__all__ = ["TokenData", "check_token_data"]


@dataclass(frozen=True)
class TokenData:
    """Factory (picklable, called on every rank) of the batch stream of a corpus file."""

    path: str
    """A text file, a folder of text files, or a ``.bin``/``.npy`` token file."""
    batch_size: int
    seq_len: int
    seed: int = 0
    labels: bool = False
    """Targets equal to the inputs (Hugging Face causal LMs) instead of shifted by one."""
    dtype: str = "uint16"
    """The ids' dtype in a ``.bin`` file (:func:`~.token_files.bin_dtype`)."""
    tokenizer: str | None = None
    """A local tokenizer folder for text (None: byte-level)."""
    split: str = "train"

    def held_out(self) -> TokenData:
        """The same corpus's held-out split."""
        return replace(self, split="test")

    @property
    def name(self) -> str:
        """How the stream names its data (a checkpoint resumes only on the same)."""
        tokens = f" tokenizer={self.tokenizer}" if self.tokenizer else ""
        return f"{Path(self.path).resolve()}{tokens}"

    def tokens(self) -> Tokens:
        return open_tokens(self.path, dtype=self.dtype, tokenizer=self.tokenizer)

    def bounds(self) -> tuple[int, int]:
        """``(first id, id count)`` of this split."""
        total = len(self.tokens())
        cut = total - int(total * HELDOUT_FRACTION)
        return (0, cut) if self.split == "train" else (cut, total - cut)

    @property
    def window(self) -> int:
        """Ids one sample reads."""
        return self.seq_len + (0 if self.labels else 1)

    def windows(self) -> int:
        """How many windows this split holds."""
        _, count = self.bounds()
        return (count - self.window) // self.seq_len + 1 if count >= self.window else 0

    def __call__(self) -> BatchStream:
        tokens, (first, _), n = self.tokens(), self.bounds(), self.windows()
        if n == 0:
            raise ValueError(check_message(self))
        shuffled = self.split == "train"

        def make_batch(index: int) -> Batch:
            if shuffled:
                rows = epoch_rows(index, batch_size=self.batch_size, rows=n, seed=self.seed)
            else:
                rows = torch.arange(index * self.batch_size, (index + 1) * self.batch_size) % n
            ids = torch.stack([torch.from_numpy(tokens.read(first + int(r) * self.seq_len,
                                                            self.window)) for r in rows])
            if self.labels:
                return ids, ids.clone()
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

        return BatchStream(make_batch, name=self.name, split=self.split,
                           batch_size=self.batch_size, seq_len=self.seq_len, seed=self.seed)


def check_message(data: TokenData) -> str:
    _, count = data.bounds()
    part = "training split (95 %)" if data.split == "train" else "held-out split (last 5 %)"
    return (f"--data {data.path}: its {part} has {count} tokens, too few for one sample of "
            f"--seq-len {data.seq_len} ({data.window} tokens); give a shorter --seq-len or more "
            f"data")


def check_token_data(data: TokenData, *, vocab_size: int, held_out: bool) -> None:
    """Every check on a corpus, before launch, each failure one line: readable UTF-8 text (when
    it is text), not empty, ids below ``vocab_size``, at least one window in the training
    split and (``held_out``) in the held-out split."""
    path = Path(data.path)
    if not (path.suffix in (".bin", ".npy") and path.is_file()):
        for file in text_files(path):
            check_utf8(file)
    tokens = data.tokens()
    if len(tokens) == 0:
        raise ValueError(f"--data {data.path}: is empty; give a file with text or token ids")
    smallest, largest = tokens.extremes()
    if smallest < 0:
        raise ValueError(f"--data {data.path}: holds the negative token id {smallest}; token "
                         f"ids are 0 or more")
    if largest >= vocab_size:
        raise ValueError(f"--data {data.path}: holds token id {largest} but the model's "
                         f"vocabulary has {vocab_size} ids; use a model with a vocabulary of at "
                         f"least {largest + 1} (e.g. --hf-config with that vocab_size), or the "
                         f"right --data-dtype/--tokenizer")
    for split in (data, data.held_out()) if held_out else (data,):
        if split.windows() == 0:
            raise ValueError(check_message(split))
