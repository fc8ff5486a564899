"""Watch the tensors autograd saves for the backward, without keeping anything alive.

The activation meter (:mod:`pipeweave.runtime.observation.memory`) and the profiler
(:mod:`pipeweave.profiler.measure`) count what a forward saves through
``torch.autograd.graph.saved_tensors_hooks``. The pack hook must hand autograd the tensor
*detached*: a node that saves its own output (``sigmoid``, ``softmax``, ``tanh``…) would
otherwise store the output with its ``grad_fn`` — the node itself — a reference cycle in C++
that Python's collector cannot see. A plain backward frees the saved tensors and so breaks it;
a split backward (zero-bubble ``I`` then ``W``) retains the graph and lets it go by reference
count, and every micro-batch's graph stayed alive (issue 24: 12 MiB a step under zb-h1).
Autograd re-attaches the ``grad_fn`` when it unpacks a saved output, so gradients are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

__all__ = ["observing_saved"]


def observing_saved(seen: Callable[[Tensor], None]) -> AbstractContextManager[None]:
    """Inside: ``seen(tensor)`` for every tensor autograd saves; nothing else changes."""

    def pack(tensor: Tensor) -> Tensor:
        seen(tensor)
        return tensor.detach()

    return torch.autograd.graph.saved_tensors_hooks(pack, _unpack)


def _unpack(tensor: Tensor) -> Tensor:
    return tensor
