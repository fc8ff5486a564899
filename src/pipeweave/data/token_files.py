"""A user's corpus as one flat sequence of token ids, memory-mapped where the file allows it.

``open_tokens(path)`` accepts:

* a token file: ``.bin`` (raw little-endian ``uint16`` or ``uint32`` ids, as nanoGPT's
  ``prepare.py`` writes them; the dtype is given, see :func:`bin_dtype`) or ``.npy`` (a 1-D
  integer array; its own header gives the dtype). Both are ``numpy.memmap``-ed: nothing is read
  until a batch needs it.
* a UTF-8 text file, or a folder of them (every file under it, hidden ones skipped, in sorted
  order of their relative paths, concatenated). Byte-level by default: the file's bytes are the
  ids (vocabulary 256), memory-mapped as ``uint8``. With ``tokenizer=DIR`` the text is encoded
  by the tokenizer saved in that local folder (``tokenizer.json`` through ``tokenizers``, else
  transformers' ``AutoTokenizer`` with ``local_files_only``), once per process, in memory: for
  a corpus larger than memory, write a ``.bin`` once and train on that.

Every way a path cannot be read is a one-line ``ValueError`` naming it and the fix.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["TOKEN_DTYPES", "Tokens", "bin_dtype", "check_utf8", "open_tokens", "text_files"]

TOKEN_DTYPES: dict[str, type[np.generic]] = {"uint16": np.uint16, "uint32": np.uint32}
"""The ids a ``.bin`` may hold (``--data-dtype``)."""

_TOKEN_SUFFIXES = (".bin", ".npy")
_CHUNK = 1 << 24  # bytes read at a time when a whole file is scanned


class Tokens:
    """Several 1-D id arrays read as one: ``len`` is the total, ``read(start, n)`` copies ids
    ``[start, start + n)`` into int64, across array boundaries."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = [p for p in parts if len(p)]
        self.ends = np.cumsum([len(p) for p in self.parts], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def read(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        done = 0
        index = int(np.searchsorted(self.ends, start, side="right"))
        while done < count:
            begin = start + done - (int(self.ends[index - 1]) if index else 0)
            piece = self.parts[index][begin:begin + count - done]
            out[done:done + len(piece)] = piece
            done += len(piece)
            index += 1
        return out

    def extremes(self) -> tuple[int, int]:
        """The smallest and largest id (scanned in chunks: a memory map is not read whole)."""
        chunks = [part[i:i + _CHUNK] for part in self.parts for i in range(0, len(part), _CHUNK)]
        return (min((int(c.min()) for c in chunks), default=0),
                max((int(c.max()) for c in chunks), default=-1))


def bin_dtype(name: str | None, vocab_size: int) -> str:
    """The dtype of a ``.bin``'s ids: ``name`` when given (``--data-dtype``), else the
    smallest that holds the model's vocabulary: ``uint16`` up to 65,536 ids (nanoGPT's choice
    for GPT-2), ``uint32`` above."""
    if name is not None:
        if name not in TOKEN_DTYPES:
            raise ValueError(f"--data-dtype {name} is not a token dtype; choose "
                             f"{' or '.join(TOKEN_DTYPES)}")
        return name
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def text_files(path: Path) -> list[Path]:
    """``path`` itself, or every non-hidden file under the folder ``path`` in sorted order."""
    if not path.exists():
        raise ValueError(f"--data {path}: no such file or folder; give a text file, a folder of "
                         f"them, or a .bin/.npy token file")
    if not path.is_dir():
        return [path]
    files = sorted((p for p in path.rglob("*") if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                   key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise ValueError(f"--data {path}: the folder holds no files; put UTF-8 text files in it")
    return files


def check_utf8(path: Path) -> None:
    """Raise a one-line error unless ``path`` is UTF-8 text (read in chunks, never whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                decoder.decode(chunk)
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"--data {path}: not UTF-8 text (near byte {offset + error.start}); "
                         f"give a UTF-8 text file or a .bin/.npy token file") from None
    except OSError as error:
        raise ValueError(f"--data {path}: cannot be read ({error.strerror or error}); fix its "
                         f"permissions or give another file") from None


def open_tokens(path: str, *, dtype: str = "uint16", tokenizer: str | None = None) -> Tokens:
    """The ids of ``path`` (see the module docstring); ``dtype`` applies to ``.bin`` files."""
    return _open(str(Path(path).resolve()), dtype, tokenizer)


@functools.lru_cache(maxsize=4)
def _open(path: str, dtype: str, tokenizer: str | None) -> Tokens:
    file = Path(path)
    if file.suffix in _TOKEN_SUFFIXES and file.is_file():
        return Tokens([_token_file(file, dtype)])
    files = text_files(file)
    if tokenizer is None:
        return Tokens([_memmap(f, np.uint8) for f in files])
    encode = _encoder(tokenizer)
    return Tokens([np.asarray(encode(_read(f)), dtype=np.int64) for f in files])


def _token_file(file: Path, dtype: str) -> np.ndarray:
    if file.suffix == ".bin":
        size = file.stat().st_size
        width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
        if size % width:
            raise ValueError(f"--data {file}: {size} bytes is not a whole number of {dtype} ids; "
                             f"give the --data-dtype it was written with")
        return _memmap(file, TOKEN_DTYPES[dtype])
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as error:
        raise ValueError(f"--data {file}: not a readable .npy array ({error}); save it with "
                         f"numpy.save") from None
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"--data {file}: holds a {array.ndim}-D {array.dtype} array; save the "
                         f"token ids as one 1-D integer array")
    return array


def _memmap(file: Path, dtype: type[np.generic]) -> np.ndarray:
    try:
        if file.stat().st_size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(file, dtype=dtype, mode="r")
    except OSError as error:
        raise ValueError(f"--data {file}: cannot be read ({error.strerror or error}); fix its "
                         f"permissions or give another file") from None


def _read(file: Path) -> str:
    from ..files import read_text

    return read_text(file, what=f"--data {file}", fix="give UTF-8 text files")


@functools.lru_cache(maxsize=2)
def _encoder(folder: str) -> "functools.partial[list[int]]":
    """``text -> ids`` of the tokenizer saved in ``folder`` (nothing is downloaded)."""
    where = Path(folder)
    if not where.is_dir():
        raise ValueError(f"--tokenizer {folder}: no such folder; give a folder holding "
                         f"tokenizer.json (or a transformers tokenizer's files)")
    if (where / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(where / "tokenizer.json"))
        return functools.partial(_fast_ids, fast)
    try:
        from transformers import AutoTokenizer

        slow = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"--tokenizer {folder}: no tokenizer found there ({error}); save one "
                         f"with tokenizer.save_pretrained(DIR)") from None
    return functools.partial(_slow_ids, slow)


def _fast_ids(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


def _slow_ids(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
