"""Profiling under the load of co-located ranks (``pipeweave.profiler.colocated``)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.profiler.measure import profile_builtin
from pipeweave.profiler import colocated
from pipeweave.profiler.colocated import colocated_load, needed_colocation, sharing_overhead


def neighbours_alive() -> list[int]:
    """Live processes running a neighbour for this test process."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "pipeweave.profiler.colocated" in command and parent == os.getpid():
            found.append(int(entry.name))
    return found


def test_neighbours_train_during_the_block_and_are_gone_after() -> None:
    with colocated_load("gpt-tiny", ranks=3, batch_sizes=[2], seq_len=16, threads=1) as count:
        assert count == 2
        assert len(neighbours_alive()) == 2
    assert neighbours_alive() == []
    with colocated_load("gpt-tiny", ranks=1, batch_sizes=[2], seq_len=16) as count:
        assert count == 0 and neighbours_alive() == []


def test_an_error_in_the_body_still_stops_them() -> None:
    with pytest.raises(KeyError):
        with colocated_load("mlp", ranks=2, batch_sizes=[4, 2], threads=1):
            raise KeyError("boom")
    assert neighbours_alive() == []


def test_a_neighbour_that_cannot_start_is_reported_at_once() -> None:
    # 0 tokens per sample: the neighbour's dataset refuses it and the process exits
    with pytest.raises(RuntimeError, match="exited with code"):
        with colocated_load("gpt-tiny", ranks=2, batch_sizes=[2], seq_len=0, threads=1):
            pass
    assert neighbours_alive() == []


def test_when_colocation_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(colocated, "machine_cores", lambda: 2)
    assert needed_colocation(2) == 1
    assert needed_colocation(4) == 4
    assert needed_colocation(4, "cuda") == 1


def test_oversubscribed_profile_records_the_slowdown_and_the_overhead() -> None:
    """2 x cores ranks on this machine's cores: the profile records the measured slowdown and
    the overhead derived from it; the blocks are timed in both. How large the slowdown is (about
    ranks / cores) is a timing claim that another job on the machine can change: it is
    measured by benchmarks/colocated.py, not asserted here."""
    if colocated.machine_cores() > 4:
        pytest.skip("needs a machine with at most 4 cores (2 x cores neighbours are started)")
    cores = colocated.machine_cores()
    ranks = 2 * cores
    shared = profile_builtin("gpt-tiny", batch_size=4, threads=1, repeats=2, colocated_ranks=ranks)
    alone = profile_builtin("gpt-tiny", batch_size=4, threads=1, repeats=2)
    meta = shared.metadata
    assert meta["colocated_ranks"] == ranks and meta["cores"] == cores
    assert "colocated_ranks" not in alone.metadata and alone.metadata["cores"] == cores
    assert 0 < meta["colocated_slowdown"] < math.inf
    assert meta["sharing_overhead"] == sharing_overhead(meta["colocated_slowdown"], ranks, cores)
    assert len(shared.compute) == len(alone.compute) and all(t > 0 for t in shared.compute)


def test_sharing_overhead_divides_out_the_ideal_split() -> None:
    assert sharing_overhead(2.12, 4, 2) == pytest.approx(1.06)
    assert sharing_overhead(1.3, 2, 2) == 1.3      # a core each: all of it is overhead
    assert sharing_overhead(1.8, 4, 2) == 1.0      # faster than the ideal split is noise
    with pytest.raises(ValueError, match="ranks and cores must be >= 1"):
        sharing_overhead(1.0, 0, 2)


def test_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="colocated_ranks=2 models ranks sharing CPU cores"):
        profile_builtin("mlp", colocated_ranks=2, device="cuda")
    with pytest.raises(ValueError, match="colocated ranks must be >= 1"):
        with colocated_load("mlp", ranks=0, batch_sizes=[4]):
            pass
    assert main(["profile", "--model", "mlp", "--colocated-ranks", "0", "--no-link"]) == 2
    assert "--colocated-ranks must be >= 1" in capsys.readouterr().err
