"""A user's corpus as a resumable batch stream (pipeweave.data.own_data, .token_files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeweave.data.own_data import TokenData, check_token_data
from pipeweave.data.token_files import bin_dtype, open_tokens

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(40))


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _data(path: Path, **kwargs: object) -> TokenData:
    settings: dict = {"batch_size": 4, "seq_len": 16, "seed": 3, **kwargs}
    return TokenData(str(path), **settings)


def test_byte_level_windows_are_the_files_bytes_shifted_by_one(text: Path) -> None:
    x, y = next(_data(text)())
    raw = torch.tensor(list(TEXT.encode()))
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    for row_x, row_y in zip(x, y):
        start = next(i for i in range(0, len(raw), 16) if torch.equal(raw[i:i + 16], row_x))
        assert start % 16 == 0 and torch.equal(raw[start + 1:start + 17], row_y)


def test_an_epoch_visits_every_training_window_once_in_a_seeded_order(tmp_path: Path) -> None:
    text = tmp_path / "unique.bin"  # every window's ids differ from every other's
    np.arange(2000, dtype=np.uint16).tofile(text)
    data = _data(text, batch_size=1)
    n = data.windows()
    stream = data()
    seen = [tuple(next(stream)[0][0].tolist()) for _ in range(n)]
    assert len(set(seen)) == n  # every window once
    again = [tuple(x[0].tolist()) for x, _ in (data().batch_at(k) for k in range(n))]
    assert again == seen  # the same order from the same seed
    other = _data(text, batch_size=1, seed=4)()
    assert [tuple(next(other)[0][0].tolist()) for _ in range(n)] != seen
    assert sorted(tuple(next(stream)[0][0].tolist()) for _ in range(n)) == sorted(seen)


def test_resuming_in_the_middle_of_an_epoch_gives_the_same_batches(text: Path) -> None:
    straight = _data(text, batch_size=16)()
    batches = [next(straight) for _ in range(12)]  # crosses epochs: 125 windows, 16 a batch
    assert _data(text).windows() < 12 * 16
    first = _data(text, batch_size=16)()
    for _ in range(5):  # stops in the middle of the first epoch
        next(first)
    resumed = _data(text, batch_size=16)()
    resumed.load_state_dict(first.state_dict())
    for want in batches[5:]:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_held_out_split_is_the_last_five_percent_read_in_order(text: Path) -> None:
    data = _data(text, batch_size=1)
    held = data.held_out()
    (first, count), (start, rest) = data.bounds(), held.bounds()
    assert first == 0 and start == count and count + rest == len(TEXT.encode())
    raw = torch.tensor(list(TEXT.encode()))
    x, y = next(held())
    assert torch.equal(x[0], raw[start:start + 16]) and torch.equal(y[0], raw[start + 1:start + 17])


def test_labels_convention_repeats_the_inputs(text: Path) -> None:
    x, y = next(_data(text, labels=True)())
    assert torch.equal(x, y) and x.shape == (4, 16)


def test_bin_npy_and_a_folder_give_the_same_ids(tmp_path: Path, text: Path) -> None:
    ids = np.frombuffer(TEXT.encode(), dtype=np.uint8)
    ids.astype(np.uint32).tofile(tmp_path / "c32.bin")
    ids.astype(np.uint16).tofile(tmp_path / "c16.bin")
    np.save(tmp_path / "c.npy", ids.astype(np.int32))
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "a.txt").write_bytes(TEXT.encode()[:1000])
    (folder / "b.txt").write_bytes(TEXT.encode()[1000:])
    (folder / ".hidden").write_text("skipped")
    want = _data(text)().batch_at(7)
    for path, dtype in [(tmp_path / "c32.bin", "uint32"), (tmp_path / "c16.bin", "uint16"),
                        (tmp_path / "c.npy", "uint16"), (folder, "uint16")]:
        got = _data(path, dtype=dtype)().batch_at(7)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), path
    assert isinstance(open_tokens(str(tmp_path / "c16.bin")).parts[0], np.memmap)


def test_bin_dtype_follows_the_vocabulary_unless_given() -> None:
    assert bin_dtype(None, 50257) == "uint16" and bin_dtype(None, 65536) == "uint16"
    assert bin_dtype(None, 65537) == "uint32" and bin_dtype("uint32", 256) == "uint32"


def test_a_local_tokenizer_encodes_the_text(tmp_path: Path, text: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.models.WordLevel({"[UNK]": 0, "the": 1, "fox": 2, "dog": 3}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    tokens = open_tokens(str(text), tokenizer=str(tmp_path / "tok"))
    ids = tokens.read(0, len(tokens))
    assert ids.tolist() == tokenizer.encode(TEXT).ids and set(ids.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"\xff\xfe abc", "not UTF-8 text"),
    (b"short", "too few for one sample of --seq-len 16"),
])
def test_bad_text_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        check_token_data(_data(path), vocab_size=256, held_out=False)


def test_ids_beyond_the_vocabulary_and_a_small_held_out_split_are_refused(tmp_path: Path) -> None:
    np.array([1, 2, 300] * 100, dtype=np.uint16).tofile(tmp_path / "big.bin")
    with pytest.raises(ValueError, match="holds token id 300 but the model's vocabulary has 256"):
        check_token_data(_data(tmp_path / "big.bin"), vocab_size=256, held_out=False)
    np.arange(200, dtype=np.uint16).tofile(tmp_path / "small.bin")
    check_token_data(_data(tmp_path / "small.bin"), vocab_size=256, held_out=False)
    with pytest.raises(ValueError, match="held-out split .* too few"):
        check_token_data(_data(tmp_path / "small.bin"), vocab_size=256, held_out=True)


def test_a_transformers_tokenizer_folder_without_tokenizer_json(tmp_path: Path, text: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "slow"
    folder.mkdir()
    vocab = {chr(c): i for i, c in enumerate(range(33, 127))} | {"\u0120": 94, "\u010a": 95}
    (folder / "vocab.json").write_text(__import__("json").dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    slow = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    slow.save_pretrained(str(folder))
    (folder / "tokenizer.json").unlink(missing_ok=True)  # the AutoTokenizer path, not tokenizers'
    tokens = open_tokens(str(text), tokenizer=str(folder))
    ids = tokens.read(0, len(tokens)).tolist()
    assert ids == slow(TEXT, add_special_tokens=False)["input_ids"] and max(ids) < 96


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path: Path, text: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="--tokenizer .*: no tokenizer found there"):
        open_tokens(str(text), tokenizer=str(tmp_path / "empty"))
