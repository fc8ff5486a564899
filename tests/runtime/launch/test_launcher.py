"""The local launcher's parts (runtime/launch/processes.py and diagnosis.py) that
tests/runtime/test_errors.py does not reach: which rank's report becomes the cause, reading
back what failed ranks had done, the fields of RunFailed, torchrun detection, and, with real
processes, the partial results and the deadline. (A raising rank named in RunFailed, a hung
peer and a SIGKILLed rank are tested in test_errors.py and tests/checkpoint/test_faults.py.)
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import socket
import sys
from pathlib import Path

import pytest

from pipeweave.runtime import RunFailed, launch_local, run_local
from pipeweave.runtime.observation.results import RankResult, partial_results
from pipeweave.runtime.launch.diagnosis import _root_cause, partials
from pipeweave.runtime.launch.processes import (_write_pickle, loopback_interface,
                                                restart_safe_store, under_torchrun)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runtime_jobs import RankFaultData, mlp_job  # noqa: E402


def _report(folder: Path, rank: int, kind: str, message: str, *, user_error: bool) -> None:
    """What a failing rank writes (processes._spawned_rank)."""
    (folder / f"rank{rank}.error.json").write_text(json.dumps({
        "type": kind, "message": message, "user_error": user_error,
        "trace": f"Traceback of rank {rank}\n{kind}: {message}"}))


def test_a_bad_input_on_any_rank_is_the_cause_rather_than_a_lost_peer(tmp_path: Path) -> None:
    _report(tmp_path, 0, "RuntimeError", "Connection closed by peer", user_error=False)
    _report(tmp_path, 3, "ValueError", "later one", user_error=True)
    _report(tmp_path, 2, "FloatingPointError", "loss became nan at\n   micro-batch 5",
            user_error=True)
    rank, cause, trace = _root_cause(tmp_path, 0, "torch's trace of rank 0")
    assert rank == 2  # the lowest rank with a user error, not the one torch reported first
    assert cause == "loss became nan at micro-batch 5"  # one line, no type for a user error
    assert trace.startswith("Traceback of rank 2")


def test_without_a_user_error_the_first_failing_rank_is_named_with_its_error_type(
        tmp_path: Path) -> None:
    _report(tmp_path, 0, "PeerTimeout", "waiting for 1RF3 from rank 0", user_error=False)
    _report(tmp_path, 1, "RuntimeError", "injected", user_error=False)
    _report(tmp_path, 2, "KeyError", "", user_error=False)
    assert _root_cause(tmp_path, 1, "")[:2] == (1, "RuntimeError: injected")
    assert _root_cause(tmp_path, 2, "")[:2] == (2, "KeyError")  # no message: the type


def test_a_rank_that_left_no_report_is_described_by_the_traceback_torch_gave(
        tmp_path: Path) -> None:
    (tmp_path / "rank1.error.json").write_text("{truncated")  # died while writing: ignored
    trace = "Traceback (most recent call last):\n  ...\nMemoryError: out of memory"
    assert _root_cause(tmp_path, 1, trace) == (1, "MemoryError: out of memory", trace)


def test_partial_results_are_read_back_by_rank_and_unreadable_ones_skipped(
        tmp_path: Path) -> None:
    for rank in (10, 2, 0):
        _write_pickle(tmp_path / f"rank{rank}.partial.pkl",
                      [RankResult(rank=rank, losses={rank: rank / 10})])
    (tmp_path / "rank3.partial.pkl").write_bytes(b"\x80\x04\x95")  # a torn write
    found = partials(tmp_path)
    assert [r.rank for r in found] == [0, 2, 10]  # rank order, not file-name order
    assert [r.losses for r in found] == [{0: 0.0}, {2: 0.2}, {10: 1.0}]
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, nothing left over


def test_run_failed_keeps_rank_cause_trace_and_partial_results_apart() -> None:
    partial = [RankResult(rank=1, losses={0: 0.5})]
    error = RunFailed("rank 1 failed: boom\nall other ranks were stopped", rank=1,
                      trace="Traceback", partial=partial)
    assert (error.rank, error.cause, error.trace) == (1, "rank 1 failed: boom", "Traceback")
    assert partial_results(error) == partial
    assert RunFailed("x", cause="given").cause == "given"


def test_loopback_interface_names_lo_or_lo0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo0"), (2, "en0")])
    assert loopback_interface() == "lo0"
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "eth0")])
    assert loopback_interface() is None


def test_torchrun_is_recognised_by_its_four_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for name in names:
        monkeypatch.setenv(name, "1")
    assert under_torchrun()
    monkeypatch.delenv("MASTER_PORT")
    assert not under_torchrun()


def test_restart_safe_store_refuses_restarts_across_nodes_sharing_one_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert restart_safe_store(5.0) is None  # not torchrun's agent store: nothing to isolate
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    with pytest.raises(ValueError, match=r"2 nodes with --max-restarts 3.*"
                                         r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        restart_safe_store(5.0)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_failed_run_brings_back_the_failing_ranks_losses_so_far() -> None:
    # rank 1 (the last stage) raises when it draws batch 3: steps 1-3 were complete
    job = dataclasses.replace(mlp_job(depth=2, steps=20, schedule="gpipe"),
                              data=RankFaultData(rank=1, at=3, mode="raise"))
    with pytest.raises(RunFailed) as caught:
        launch_local(job, deadline_s=100)
    error = caught.value
    assert error.rank == 1 and error.cause == "RuntimeError: injected failure on rank 1"
    assert "Traceback (most recent call last)" in error.trace and "runtime_jobs.py" in error.trace
    (failed,) = [r for r in partial_results(error) if r.rank == 1]
    assert sorted(failed.losses) == list(range(12))  # 3 steps x 4 micro-batches, no more
    reference = run_local(dataclasses.replace(job, steps=3))  # the same steps, in one process
    expected = {j: v for result in reference for j, v in result.losses.items()}
    for j, value in failed.losses.items():
        assert value == pytest.approx(expected[j], rel=1e-12)
    assert not multiprocessing.active_children()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_run_past_its_deadline_is_stopped_with_every_rank() -> None:
    job = dataclasses.replace(mlp_job(depth=2, steps=20), timeout_s=600.0,
                              data=RankFaultData(rank=0, at=1, mode="hang"))
    with pytest.raises(RunFailed, match="run exceeded its deadline of 4 s; stopped all ranks"):
        launch_local(job, deadline_s=4)
    assert not multiprocessing.active_children()
