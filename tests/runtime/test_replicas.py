"""The replica pool that holds weight versions (runtime/execution/replicas.py), unit by unit."""

from __future__ import annotations

import torch
from torch import nn

from pipeweave.runtime.execution.replicas import ReplicaPool


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_take_live_copies_the_weights_and_later_updates_leave_the_copy_alone() -> None:
    live = _module()
    pool = ReplicaPool(live)
    replica = pool.take_live()
    before = [p.detach().clone() for p in live.parameters()]
    with torch.no_grad():
        for p in live.parameters():
            p.add_(1.0)
    for kept, original in zip(replica.params, before):
        assert torch.equal(kept, original)
    assert pool.bytes_copied == sum(p.numel() * 4 for p in live.parameters())


def test_replicas_share_the_live_buffers_and_follow_its_mode() -> None:
    live = _module()
    pool = ReplicaPool(live)
    replica = pool.take_live()
    live_bn, replica_bn = live[1], replica.module[1]
    assert replica_bn.running_mean is live_bn.running_mean  # one set of statistics
    replica.module(torch.randn(8, 4))
    assert not torch.equal(live_bn.running_mean, torch.zeros(4))  # updated through the replica
    live.eval()
    pool.release(replica)
    assert not pool.acquire().module.training


def test_move_grads_moves_or_adds_and_clears_the_replica() -> None:
    live = _module()
    pool = ReplicaPool(live)
    first, second = pool.take_live(), pool.take_live()
    x = torch.randn(8, 4)
    first.module(x).sum().backward()
    expected = [p.grad.clone() for p in first.params]
    moved = [p.grad for p in first.params]
    pool.move_grads(first)
    assert all(p.grad is None for p in first.params)
    assert all(l.grad is m for l, m in zip(live.parameters(), moved))  # no copy
    second.module(x).sum().backward()
    pool.move_grads(second)
    for l, e in zip(live.parameters(), expected):
        assert torch.allclose(l.grad, 2 * e)


def test_a_released_replica_is_reused_not_rebuilt() -> None:
    pool = ReplicaPool(_module())
    replicas = [pool.take_live() for _ in range(2)]
    for replica in replicas:
        pool.release(replica)
    for _ in range(10):
        pool.release(pool.take_live())
    assert pool.allocations == 2 and pool.held == 0
