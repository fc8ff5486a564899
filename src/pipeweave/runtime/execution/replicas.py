"""Preallocated copies of a stage module that hold other weight versions than the live one.

A weight version other than the live one (a stashed version, a predicted one) lives in a
*replica*: a deep copy of the stage module made once, whose parameters are overwritten in
place with :func:`torch._foreach_copy_` (or written by the prediction) each time it takes a
new version. A forward on that version calls the replica like any module — no re-binding of
parameters per call as ``torch.func.functional_call`` does, no allocation per version — and
its backward leaves the weight gradients in the replica's ``.grad``, from where
:meth:`ReplicaPool.move_grads` hands them to the live parameters (a reference move when the
live parameter has no gradient yet, one ``_foreach_add_`` otherwise).

Replicas share the live module's buffers (running statistics stay one set, as they are
under ``functional_call``), follow its train/eval mode, and go back to the pool when the
last action that names their version has run; the pool only grows while the steady state is
reached (the first iteration), so a steady-state update allocates nothing.
:attr:`ReplicaPool.allocations` and :attr:`ReplicaPool.bytes_copied` count both for the
benchmark.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

__all__ = ["Replica", "ReplicaPool"]


class Replica:
    """One copy of the stage module; ``params`` lists its parameters in the live order."""

    def __init__(self, live: nn.Module) -> None:
        self.module = copy.deepcopy(live)
        for param in self.module.parameters():
            param.grad = None
        _share_buffers(self.module, live)
        self.params: list[Tensor] = list(self.module.parameters())

    def named(self, names: list[str]) -> dict[str, Tensor]:
        return dict(zip(names, self.params))


class ReplicaPool:
    """Replicas of one stage module, handed out and taken back (module docstring)."""

    def __init__(self, live: nn.Module) -> None:
        self.live = live
        self.live_params: list[Tensor] = list(live.parameters())
        self.names = [name for name, _ in live.named_parameters()]
        self._free: list[Replica] = []
        self.allocations = 0
        """Replicas built so far (each one the size of the stage's parameters)."""
        self.bytes_copied = 0
        """Bytes written into replicas by :meth:`take_live` (stashing a version)."""
        self._bytes = sum(p.numel() * p.element_size() for p in self.live_params)

    def acquire(self) -> Replica:
        """A free replica (built if none is free), in the live module's train/eval mode."""
        if self._free:
            replica = self._free.pop()
        else:
            replica = Replica(self.live)
            self.allocations += 1
        if replica.module.training != self.live.training:
            replica.module.train(self.live.training)
        return replica

    def release(self, replica: Replica) -> None:
        for param in replica.params:
            param.grad = None
        self._free.append(replica)

    def take_live(self) -> Replica:
        """A replica holding a copy of the live weights (one foreach copy, no allocation)."""
        replica = self.acquire()
        with torch.no_grad():
            torch._foreach_copy_(replica.params, [p.detach() for p in self.live_params])
        self.bytes_copied += self._bytes
        return replica

    def move_grads(self, replica: Replica) -> None:
        """Add the replica's weight gradients to the live parameters' and clear them."""
        moved_into: list[Tensor] = []
        moved_from: list[Tensor] = []
        with torch.no_grad():
            for live, param in zip(self.live_params, replica.params):
                grad = param.grad
                if grad is None:
                    continue
                param.grad = None
                if live.grad is None:
                    live.grad = grad
                else:
                    moved_into.append(live.grad)
                    moved_from.append(grad)
            if moved_into:
                torch._foreach_add_(moved_into, moved_from)

    @property
    def held(self) -> int:
        """Replicas built and not in the free list."""
        return self.allocations - len(self._free)


def _share_buffers(replica: nn.Module, live: nn.Module) -> None:
    """Point every buffer of ``replica`` at the live module's tensor (one set of statistics)."""
    live_modules = dict(live.named_modules())
    for name, module in replica.named_modules():
        source = live_modules[name]
        for key in list(module._buffers):
            module._buffers[key] = source._buffers[key]
