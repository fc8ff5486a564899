"""Host (gloo) collectives let go of their buffers on the rank's thread
(``communication/let_go.py``, ``host_collectives.py``): gloo's worker thread dropped its references a moment
after ``wait()`` returned, so a buffer the rank let go of first was freed on gloo's thread,
where torch's profiler records no free, and ``track_allocations`` counted it alive to the end
(rank 3 of the sharded memory test up to 1.85 MB over). FSDP2's reduce-scatter and all-gather
done this way give gloo's own results, bit for bit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipeweave.runtime.communication import let_go
from pipeweave.runtime.communication.host_collectives import HostAllGather, HostReduceScatter
from pipeweave.runtime.communication.let_go import LetGo


class _LateWorker:
    """gloo's worker in slow motion: its work is complete at once, but the worker keeps a
    view of the tensor until the rank's thread next yields (``time.sleep``)."""

    def __init__(self) -> None:
        self.held: list[torch.Tensor] = []
        self.let_go = False

    def issue(self, tensor: torch.Tensor) -> Any:
        self.held.append(tensor.view(-1))  # what gloo's work keeps: a reference in torch
        return _Done()

    def sleep(self, seconds: float) -> None:  # the rank yields: the worker runs, drops it
        thread = threading.Thread(target=self._finish)
        thread.start()
        thread.join()

    def _finish(self) -> None:
        self.held.clear()
        self.let_go = True


class _Done:
    def wait(self, timeout: object = None) -> bool:
        return True


def test_wait_returns_only_once_the_worker_has_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _LateWorker()
    monkeypatch.setattr(let_go.time, "sleep", worker.sleep)
    buffer = torch.zeros(1024)
    LetGo(worker.issue, buffer).wait()
    assert worker.let_go, "wait returned while gloo's thread still held the buffer"


def test_wait_returns_at_once_when_nothing_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(seconds: float) -> None:
        raise AssertionError("waited for a buffer no one held")

    monkeypatch.setattr(let_go.time, "sleep", never)
    LetGo(lambda tensor: _Done(), torch.zeros(8)).wait()


def test_only_a_sum_is_reduced() -> None:
    with pytest.raises(ValueError, match=r"HostReduceScatter sums .*force_sum_reduction"):
        HostReduceScatter()(torch.zeros(2), torch.zeros(4), dist.group.WORLD,  # type: ignore[arg-type]
                            dist.ReduceOp.MAX)


def _rank(process: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=process, world_size=2)
    try:
        group = dist.new_group([0, 1])
        torch.manual_seed(process)
        gradients = torch.randn(4, 1000, dtype=torch.float64).reshape(-1)
        want, got = torch.empty(2000, dtype=torch.float64), torch.empty(2000, dtype=torch.float64)
        dist.reduce_scatter_tensor(want, gradients.clone(), group=group)
        HostReduceScatter()(got, gradients.clone(), group, dist.ReduceOp.SUM)
        shard = gradients[:1000].clone()
        gathered, mine = torch.empty(2000, dtype=torch.float64), torch.empty(2000,
                                                                            dtype=torch.float64)
        dist.all_gather_into_tensor(gathered, shard, group=group)
        work = HostAllGather()(mine, shard, group, async_op=True)  # as FSDP2's prefetch
        assert work is not None
        work.wait()
        torch.save({"reduced": (want, got), "gathered": (gathered, mine)}, f"{out}/{process}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_fsdp_collectives_give_gloos_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    for process in range(2):
        results = torch.load(tmp_path / f"{process}.pt")
        for name, (want, got) in results.items():
            assert torch.equal(want, got), (process, name)


def test_a_host_stage_uses_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``shard_stage`` on a gloo group installs both on every sharded block."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from pipeweave.ir import Action, Op
    from pipeweave.runtime.execution.sharding import shard_stage

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        module = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
        shard_stage(module, dist.group.WORLD, "full", device_type="cpu",  # type: ignore[arg-type]
                    program=[Action(Op.STEP, 0, version=1)], stage=0)
        for block in (module[0], module[2]):
            (group,) = fully_shard.state(block)._fsdp_param_groups  # type: ignore[attr-defined]
            assert isinstance(group._reduce_scatter_comm, HostReduceScatter)
            assert isinstance(group._all_gather_comm, HostAllGather)
    finally:
        dist.destroy_process_group()


def test_a_buffer_held_for_good_is_given_up_with_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[torch.Tensor] = []
    monkeypatch.setattr(let_go, "LET_GO_S", 0.0)
    with pytest.warns(RuntimeWarning, match="still held"):
        LetGo(lambda tensor: kept.append(tensor.view(-1)) or _Done(), torch.zeros(8)).wait()
