"""Tests for the offline datasets and resumable batch streams."""

from __future__ import annotations

import sys

import pytest
import torch

from pipeweave.data import BatchStream, available_datasets, build_dataset
from pipeweave.data.digits import load_digits_split
from pipeweave.data.stdlib_corpus import corpus_split, load_stdlib_bytes, stdlib_source_files


def _equal(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_available() -> None:
    assert available_datasets() == ["digits", "stdlib-bytes", "stdlib-bytes-labels"]


def test_labels_variant_repeats_the_inputs_of_the_same_windows() -> None:
    """Hugging Face's convention: targets are the inputs (its causal-LM loss shifts them)."""
    x, y = next(build_dataset("stdlib-bytes-labels", batch_size=4, seq_len=32, seed=5))
    shifted_x, _ = next(build_dataset("stdlib-bytes", batch_size=4, seq_len=32, seed=5))
    assert torch.equal(x, y) and torch.equal(x, shifted_x) and x.dtype == torch.int64


def test_stdlib_files_skip_tests_and_site_packages() -> None:
    files = stdlib_source_files()
    assert files, "the stdlib should have .py sources"
    assert not any(part in {"site-packages", "test", "tests"} for f in files for part in f.parts)


def test_corpus_is_capped_and_split() -> None:
    small = load_stdlib_bytes(max_bytes=10_000)
    assert small.dtype == torch.uint8 and len(small) == 10_000
    train, test = corpus_split(small, "train"), corpus_split(small, "test")
    assert len(train) == 9_500 and len(test) == 500
    assert torch.equal(torch.cat([train, test]), small)


def test_corpus_batches_shape_shift_and_determinism() -> None:
    x, y = next(build_dataset("stdlib-bytes", batch_size=4, seq_len=32, seed=5))
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < 256
    again = next(build_dataset("stdlib-bytes", batch_size=4, seq_len=32, seed=5))
    other = next(build_dataset("stdlib-bytes", batch_size=4, seq_len=32, seed=6))
    assert _equal((x, y), again) and not _equal((x, y), other)


def test_corpus_default_seq_len_and_test_split() -> None:
    stream = build_dataset("stdlib-bytes", batch_size=2, split="test")
    x, _ = next(stream)
    assert x.shape == (2, 64)
    assert stream.state_dict()["seq_len"] == 64


@pytest.mark.parametrize(("name", "seq_len"), [("stdlib-bytes", 16), ("digits", None)])
def test_resume_from_state_dict(name: str, seq_len: int | None) -> None:
    stream = build_dataset(name, batch_size=300, seq_len=seq_len, seed=1)
    for _ in range(3):
        next(stream)
    state = stream.state_dict()
    expected = next(stream)
    resumed = build_dataset(name, batch_size=300, seq_len=seq_len, seed=1)
    resumed.load_state_dict(state)
    assert resumed.position == 3
    assert _equal(next(resumed), expected)
    assert _equal(stream.batch_at(3), expected) and stream.position == 4


def test_load_state_dict_rejects_other_stream() -> None:
    state = build_dataset("digits", batch_size=8, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1.*seed=2"):
        build_dataset("digits", batch_size=8, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="position=-1"):
        build_dataset("digits", batch_size=8, seed=1).load_state_dict({**state, "position": -1})


def test_digits_values_and_epochs() -> None:
    xtr, ytr = load_digits_split("train")
    xte, yte = load_digits_split("test", dtype=torch.float64)
    assert xtr.shape[1] == 64 and len(xtr) + len(xte) == 1797 and len(xte) == 359
    assert xte.dtype == torch.float64 and ytr.dtype == torch.int64
    assert 0.0 <= float(xtr.min()) and float(xtr.max()) <= 1.0
    # One epoch of batches visits every training example exactly once.
    stream = build_dataset("digits", batch_size=len(ytr), seed=3)
    x, y = next(stream)
    assert x.shape == (len(ytr), 64) and x.dtype == torch.float32
    assert torch.equal(torch.sort(y).values, torch.sort(ytr).values)
    assert not torch.equal(x, next(stream)[0])  # reshuffled next epoch


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="'imagenet'.*digits.*stdlib-bytes"):
        build_dataset("imagenet", batch_size=1)
    with pytest.raises(ValueError, match="batch_size=0"):
        build_dataset("digits", batch_size=0)
    with pytest.raises(ValueError, match="'val'"):
        build_dataset("digits", batch_size=1, split="val")
    with pytest.raises(ValueError, match="seq_len=8"):
        build_dataset("digits", batch_size=1, seq_len=8)
    with pytest.raises(ValueError, match="seq_len=0"):
        build_dataset("stdlib-bytes", batch_size=1, seq_len=0)


def test_digits_read_without_sklearn_are_sklearns_load_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled CSV read directly gives exactly ``load_digits()``; so does the fallback."""
    from sklearn.datasets import load_digits

    from pipeweave.data import digits

    bunch = load_digits()
    expected = (torch.as_tensor(bunch.data, dtype=torch.float64) / 16.0,
                torch.as_tensor(bunch.target, dtype=torch.int64))
    assert digits._bundled_csv() is not None
    digits._load_all.cache_clear()
    assert _equal(digits._load_all(), expected)
    monkeypatch.setattr(digits, "_bundled_csv", lambda: None)
    digits._load_all.cache_clear()
    try:
        assert _equal(digits._load_all(), expected)
    finally:
        digits._load_all.cache_clear()


def test_missing_sklearn_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        build_dataset("digits", batch_size=1)


def test_stream_is_an_iterator() -> None:
    stream = build_dataset("digits", batch_size=2)
    assert isinstance(stream, BatchStream) and iter(stream) is stream
    batches = [b for _, b in zip(range(3), stream, strict=False)]
    assert len(batches) == 3 and stream.position == 3
