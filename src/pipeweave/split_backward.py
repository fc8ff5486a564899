"""The backward split in two with stock autograd: input gradient first, weight gradients later.

Zero-bubble schedules run a micro-batch's backward as ``I`` (the gradient of the stage input,
which the previous stage waits for) and, later, ``W`` (the weight gradients, which fill a
bubble). This module does that for any ``nn.Module`` without tracing or graph surgery:

1. :func:`recording` — while the forward runs, forward hooks record the output of every
   module that holds parameters (the parameters' own point in the graph).
2. :func:`input_gradient` — one ``torch.autograd.grad`` pass over the retained graph asks for
   the gradient of the input *and* of those outputs. No parameter is asked for, so autograd
   computes no weight gradient (the weight branch of each matmul is skipped).
3. :func:`weight_gradient` — each module's backward is finished from its recorded output and
   gradient to its own parameters only: the weight-gradient matmuls and nothing of the
   input-gradient chain again, accumulated into ``.grad`` as one whole backward would. A
   linear map (``F.linear``'s graph: ``addmm``/``mm`` of the input and ``weight.t()``, found
   on the recorded output's ``grad_fn``, autocast's casts allowed) is done directly, with no
   autograd engine call (:func:`linear_weight_gradient`: ``grad.t().mm(input)`` and
   ``grad.sum_to_size(bias)`` from the input its graph saved, the very ops autograd's
   formulas run, so the same bits); every other holder by one engine call
   (``torch.autograd.backward(..., inputs=params)``). Why: ``W`` made one engine call per
   holder (~9 per decoder layer), each with a fixed host cost (engine start, device-thread
   handoff) that on a GPU may exceed the small kernels it launches; on a CPU stage of tiny
   blocks the direct path halves ``W`` (``benchmarks/split_backward_cost.py --tiny``).

A parameter that cannot be reached that way gets its gradient from the module's output
instead (correct, and dearer: that path is traversed again): one held by two modules, one
whose module is called twice or returns something other than one tensor, or whose module's
output was changed in place afterwards (``ReLU(inplace=True)``). Between the two halves the
graph, the recorded outputs and their gradients stay alive; :func:`weight_gradient` lets
them go. Used by the runtime's stage (:mod:`pipeweave.runtime.execution.stage`) and by the
profiler, which times the halves separately.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

__all__ = ["RecordedOutput", "PendingWeights", "recording", "input_gradient", "weight_gradient",
           "linear_weight_gradient", "parameter_holders"]


@dataclass
class RecordedOutput:
    """The output of a module holding parameters, recorded during the forward."""

    output: Tensor
    version: int
    """``output._version`` when recorded: if it changed, the tensor was modified in place."""
    params: list[nn.Parameter]


@dataclass
class PendingWeights:
    """What :func:`input_gradient` leaves for :func:`weight_gradient`."""

    output: Tensor
    grad: Tensor | None
    """The gradient the backward started from (None: the output is a scalar loss)."""
    parts: list[tuple[Tensor, Tensor, list[nn.Parameter]]] = field(default_factory=list)
    """(module output, its gradient, the module's parameters)."""
    module: nn.Module | None = None
    """The module whose parameters not in ``covered`` get their gradient from ``output``
    (see the module docstring); asked at ``W``, when they are the ones the graph holds."""
    covered: set[int] = field(default_factory=set)
    """``id`` of the parameters ``parts`` covers."""
    trainable: int = 0
    """How many parameters of ``module`` need a gradient (the same count sharded or not)."""

    @property
    def complete(self) -> bool:
        """Whether ``parts`` covers every parameter (nothing comes from ``output``)."""
        return len(self.covered) == self.trainable

    @property
    def rest(self) -> list[nn.Parameter]:
        """Parameters whose gradient comes from ``output`` (see the module docstring)."""
        if self.module is None:
            return []
        return [p for p in self.module.parameters()
                if p.requires_grad and id(p) not in self.covered]


_HOLDERS: WeakKeyDictionary[nn.Module, list[tuple[nn.Module, list[str]]]] = WeakKeyDictionary()


def _holder_names(module: nn.Module) -> list[tuple[nn.Module, list[str]]]:
    """The sub-modules holding parameters that need a gradient, each with the names of the
    parameters only it holds (one held by two modules is left out); cached per module.
    Names, not tensors: FSDP2 swaps a module's parameters between its sharded and its
    gathered ones, and the forward's graph holds those registered when the module ran."""
    cached = _HOLDERS.get(module)
    if cached is None:
        owners: dict[int, int] = {}
        for owner in module.modules():
            for param in owner.parameters(recurse=False):
                owners[id(param)] = owners.get(id(param), 0) + 1
        cached = []
        for owner in module.modules():
            names = [name for name, p in owner.named_parameters(recurse=False)
                     if p.requires_grad and owners[id(p)] == 1]
            if names:
                cached.append((owner, names))
        _HOLDERS[module] = cached
    return cached


def parameter_holders(module: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The sub-modules holding parameters that need a gradient, each with the parameters only
    it holds now (a parameter held by two modules is left out)."""
    return [(owner, [owner.get_parameter(name) for name in names])
            for owner, names in _holder_names(module)]


@contextmanager
def recording(module: nn.Module) -> Iterator[list[RecordedOutput]]:
    """Record the outputs of ``module``'s parameter holders while its forward runs inside."""
    recorded: list[RecordedOutput] = []
    holder_of: dict[int, int] = {}  # id of a record: the index of its holder
    used: dict[int, list[nn.Parameter]] = {}  # holder index: the parameters its call saw
    seen: set[int] = set()
    spoiled: set[int] = set()

    def before(index: int, names: list[str]) -> Callable[..., None]:
        def take(owner: nn.Module, _args: object) -> None:
            # the parameters the graph will hold, read when the call starts: FSDP2 gathers
            # them in an earlier pre-hook and may shard them again in an earlier post-hook
            used[index] = [owner.get_parameter(name) for name in names]
        return take

    def hook(index: int) -> Callable[..., None]:
        def record(_owner: nn.Module, _args: object, output: object) -> None:
            if isinstance(output, Tensor) and output.requires_grad and index not in seen:
                recorded.append(RecordedOutput(output, output._version, used[index]))
                holder_of[id(recorded[-1])] = index
            else:  # called twice, or not one tensor out: reached from the output instead
                spoiled.add(index)
            seen.add(index)
        return record

    handles = []
    for index, (owner, names) in enumerate(_holder_names(module)):
        handles.append(owner.register_forward_pre_hook(before(index, names)))
        handles.append(owner.register_forward_hook(hook(index)))
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
    recorded[:] = [r for r in recorded if holder_of[id(r)] not in spoiled]


def input_gradient(module: nn.Module, inputs: Tensor, output: Tensor, grad: Tensor | None,
                   recorded: list[RecordedOutput]) -> tuple[Tensor | None, PendingWeights]:
    """The gradient of ``inputs`` (None when it needs none) and what the weights still need.

    ``output`` is what ``module`` computed from ``inputs`` while :func:`recording` filled
    ``recorded``; ``grad`` the gradient of ``output`` (None for a scalar loss).
    """
    usable = [r for r in recorded if r.output._version == r.version]
    wants_input = inputs.requires_grad
    targets = ([inputs] if wants_input else []) + [r.output for r in usable]
    found: tuple[Tensor | None, ...] = ()
    if targets:
        found = torch.autograd.grad(output, targets, grad, retain_graph=True, allow_unused=True)
    pending = PendingWeights(output, grad, module=module,
                             covered={id(p) for r in usable for p in r.params},
                             trainable=sum(1 for p in module.parameters() if p.requires_grad))
    for r, gradient in zip(usable, found[1:] if wants_input else found):
        if gradient is not None:  # None: the output does not reach the loss
            pending.parts.append((r.output, gradient, r.params))
    if not wants_input:
        return None, pending
    return (found[0] if found[0] is not None else torch.zeros_like(inputs)), pending


def weight_gradient(pending: PendingWeights, within: Collection[int] | None = None) -> None:
    """Accumulate the weight gradients :func:`input_gradient` left pending into ``.grad``.

    ``within``: only the parts whose parameters all have their ``id`` there, taken out of
    ``pending`` (a sharded stage gathers one block at a time); the rest stays pending."""
    if within is not None:
        owned = [all(id(p) in within for p in part[2]) for part in pending.parts]
        mine = [part for part, own in zip(pending.parts, owned) if own]
        pending.parts = [part for part, own in zip(pending.parts, owned) if not own]
        for output, gradient, params in mine:
            _part_gradient(output, gradient, params)
        return
    for output, gradient, params in pending.parts:
        _part_gradient(output, gradient, params)
    rest = pending.rest
    if rest:
        torch.autograd.backward(pending.output, pending.grad, inputs=rest)


def _part_gradient(output: Tensor, gradient: Tensor, params: list[nn.Parameter]) -> None:
    """One holder's weight gradients: a linear's from its saved input, any other by autograd."""
    if not linear_weight_gradient(output, gradient, params):
        torch.autograd.backward(output, gradient, inputs=params, retain_graph=True)


def _leaf(edge: tuple[object, int]) -> tuple[Tensor | None, bool]:
    """The parameter an edge of the graph accumulates into, and whether a cast lies between
    (autocast's copy); (None, False) when the edge is anything else."""
    node = edge[0]
    cast = type(node).__name__ == "ToCopyBackward0"
    if cast:
        node = node.next_functions[0][0]  # type: ignore[attr-defined]
    if type(node).__name__ != "AccumulateGrad":
        return None, False
    return node.variable, cast  # type: ignore[attr-defined]


def _linear_node(output: Tensor, gradient: Tensor) -> tuple[object, Tensor] | None:
    """The matmul node of a linear's output and the gradient reshaped as that node receives
    it (a 3-D input is flattened to rows), or None when the graph is not that shape."""
    node = output.grad_fn
    if type(node).__name__ in ("ViewBackward0", "UnsafeViewBackward0"):
        gradient = gradient.reshape(node._saved_self_sym_sizes)  # type: ignore[union-attr]
        node = node.next_functions[0][0]  # type: ignore[union-attr]
    kind = type(node).__name__
    if kind == "AddmmBackward0":
        if node._saved_alpha != 1 or node._saved_beta != 1:  # type: ignore[union-attr]
            return None
    elif kind != "MmBackward0":
        return None
    return node, gradient


def linear_weight_gradient(output: Tensor, gradient: Tensor,
                           params: list[nn.Parameter]) -> bool:
    """Accumulate the weight and bias gradients of the linear map that made ``output``
    straight from the input its graph saved, without the autograd engine; False (nothing
    done) unless the graph is exactly ``F.linear``'s (``addmm``/``mm`` of the input and the
    transposed weight, each parameter reached directly or through autocast's cast).

    The same ops as autograd's formulas, so the same bits: weight ``grad.t().mm(input)``
    (``mm_mat2_backward`` of a column-major ``weight.t()``), bias ``grad.sum_to_size`` (the
    engine's reduction of a broadcast), each cast back to the parameter's dtype as
    ``ToCopyBackward0`` does, then added to ``.grad`` as ``AccumulateGrad`` does."""
    found = _linear_node(output, gradient)
    if found is None:
        return False
    node, grad = found
    mm = type(node).__name__ == "MmBackward0"
    edges = node.next_functions  # type: ignore[attr-defined]
    transpose = edges[1 if mm else 2][0]
    sizes = tuple(node._saved_mat2_sym_sizes)  # type: ignore[attr-defined]
    strides = tuple(node._saved_mat2_sym_strides)  # type: ignore[attr-defined]
    if grad.dim() != 2 or transpose is not None and (
            type(transpose).__name__ != "TBackward0" or strides != (1, sizes[0])):
        return False  # not weight.t() of a contiguous weight (nor a frozen weight)
    weight, weight_cast = (None, False) if transpose is None else _leaf(transpose.next_functions[0])
    bias, bias_cast = (None, False) if mm else _leaf(edges[0])
    leaves = [t for t in (weight, bias) if t is not None]
    if ({id(t) for t in leaves} != {id(p) for p in params}
            or any(t._backward_hooks or t._post_accumulate_grad_hooks for t in leaves)):
        return False
    saved_input = node._saved_self if mm else node._saved_mat1  # type: ignore[attr-defined]
    with torch.no_grad():
        if weight is not None:
            new = grad.t().mm(saved_input)
            _accumulate(weight, new.to(weight.dtype) if weight_cast else new)
        if bias is not None:
            new = grad.sum_to_size(bias.shape)
            _accumulate(bias, new.to(bias.dtype) if bias_cast else new)
    return True


def _accumulate(param: Tensor, new: Tensor) -> None:
    """``.grad += new`` as ``AccumulateGrad`` does: the first one is taken as it is."""
    if param.grad is None:
        param.grad = new
    else:
        param.grad += new
