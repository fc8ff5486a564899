"""StageRuntime: one stage's blocks, its forward/backward and the activations it stashes.

A forward keeps what its backward will need, keyed by (micro-batch, piece, pipeline): the
input (which must receive a gradient) and the output graph — or, with recomputation, only the
input and the RNG state, re-running the forward at backward time. A backward of a whole
micro-batch whose forward ran in two halves (the Slicer) back-propagates each half with its
rows of the incoming gradient and concatenates the input gradients.

**Split backward** (zero-bubble schedules: ``I`` then ``W``, :mod:`pipeweave.ir.actions`). With
``split_backward`` the forward records what the weight gradients will need and
:meth:`StageRuntime.backward_input` / :meth:`StageRuntime.backward_weight` run the two halves
(:mod:`pipeweave.split_backward`: stock autograd, no weight gradient in ``I``, nothing of the
input-gradient chain again in ``W``). The micro-batch's activations count as stashed until its
``W``.

**Precision** (:mod:`pipeweave.precision`): with ``bf16-mixed`` the forward, the loss and
the recomputed forward run under ``torch.autocast(bfloat16)`` on the input's device (the split
backward's recording inside it, so ``W`` back-propagates through the same casts); what the stage
returns is what autocast produced, and its gradient comes back in that dtype. With ``bf16`` the
first stage's floating inputs and the last stage's floating targets are cast to bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ...precision import cast_input, compute
from ...split_backward import (PendingWeights, RecordedOutput, input_gradient, recording,
                               weight_gradient)
from .losses import LossLog

if TYPE_CHECKING:
    from .sharding import StageSharding

__all__ = ["StageRuntime", "StagePlace", "StageTraining", "StageError", "HeldActivations"]

Key = tuple[int, int, int]
"""(micro-batch, piece, pipeline)."""


class StageError(RuntimeError):
    """A stage's forward or backward failed; the message names the stage and the inputs."""


@dataclass
class _Stash:
    inputs: Tensor
    output: Tensor | None  # None when recomputing
    rng_state: Tensor | None
    rows: int
    target: Tensor | None
    module: nn.Module | None = None
    """The module the forward ran (a replica, or None: the stage's own)."""
    recorded: list[RecordedOutput] | None = None
    """Split backward: the parameter-holding modules' outputs (None: not recorded)."""


@dataclass
class _Pending:
    """What an ``I`` leaves for its ``W``."""

    weights: PendingWeights
    nbytes: int
    """The stashed bytes the micro-batch counts until its ``W``."""


class HeldActivations:
    """Micro-batches whose activations one rank holds now, over all its stages, and the most
    at once (what the simulator's ``peak_activations`` counts per rank)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def change(self, delta: int) -> None:
        self.now += delta
        self.peak = max(self.peak, self.now)


@dataclass(frozen=True)
class StagePlace:
    """Where a stage sits in the model."""

    stage: int
    block_range: tuple[int, int]
    """Its blocks, ``start .. end - 1`` of the model's."""
    is_first: bool = False
    is_last: bool = False
    """The last stage computes the loss."""


@dataclass(frozen=True)
class StageTraining:
    """How a stage trains, fixed by the plan and the schedule (module docstring)."""

    recompute: bool = False
    """Keep only a forward's input and RNG state; run it again at backward time."""
    loss_scale: float = 1.0
    """``M / K`` (M micro-batches per batch, K per update of the last stage), what the
    batch-weighted loss is multiplied by before its backward."""
    update_scale: float = 1.0
    """``K / K_s``, what this stage's summed gradients are multiplied by before its step."""
    split_backward: bool = False
    """The schedule runs this stage's backwards as ``I`` and ``W`` (the forward records what
    ``W`` needs)."""
    precision: str = "full"
    """One of :data:`pipeweave.precision.PRECISIONS`."""


class StageRuntime:
    """Executes forward/backward of one stage (a contiguous range of blocks)."""

    def __init__(self, *, place: StagePlace, blocks: nn.Module,
                 loss_fn: Callable[[Tensor, Tensor], Tensor],
                 training: StageTraining = StageTraining(),
                 held: HeldActivations | None = None) -> None:
        """``held``: the count of activations shared by the rank's stages."""
        self.stage = place.stage
        self.module = blocks
        self.block_range = place.block_range
        self.is_first = place.is_first
        self.is_last = place.is_last
        self.loss_fn = loss_fn
        self.recompute = training.recompute
        self.loss_scale = training.loss_scale
        self.update_scale = training.update_scale
        self.split_backward = training.split_backward
        self.precision = training.precision
        self._stash: dict[Key, _Stash] = {}
        self._pending: dict[Key, _Pending] = {}
        """Split backwards between their ``I`` and ``W``."""
        self.held = held if held is not None else HeldActivations()
        self._alive = 0  # micro-batches with a stash or a pending W here
        self.loss_log = LossLog(place.stage)
        """Weighted loss contribution per micro-batch (last stage only)."""
        self.peak_stashed = 0
        self.peak_stashed_bytes = 0
        self._stashed_bytes = 0
        self.sharding: StageSharding | None = None
        """FSDP2 over the stage's data-parallel ranks (``Plan.shard``; :mod:`.sharding`)."""

    @property
    def losses(self) -> dict[int, float]:
        """Weighted loss per micro-batch (last stage only), every one computed so far: on a
        GPU this waits for the last ones (:mod:`.losses`)."""
        return self.loss_log.values()

    # -- forward ----------------------------------------------------------------------
    def _run(self, inputs: Tensor, replica: nn.Module | None) -> Tensor:
        return (self.module if replica is None else replica)(inputs)

    def forward(self, key: Key, inputs: Tensor, *, target: Tensor | None = None,
                batch_rows: int = 1, replica: nn.Module | None = None,
                keep_graph: bool | None = None) -> Tensor | None:
        """Run the stage on ``inputs``; return the activation to pass on (None on the last stage).

        ``replica`` runs instead of the stage's module: a copy holding a stashed or predicted
        weight version (:mod:`.weights`);
        ``keep_graph=False`` runs under ``no_grad`` and recomputes in the backward (default:
        the stage's recomputation setting).
        """
        keep = not self.recompute if keep_graph is None else keep_graph
        if self.is_first:
            inputs = cast_input(inputs, self.precision)
        if target is not None:
            target = cast_input(target, self.precision)
        if not self.is_first and inputs.is_floating_point() and not inputs.requires_grad:
            inputs = inputs.detach().requires_grad_(True)
        rng = None if keep else torch.get_rng_state()
        rows = inputs.shape[0]
        with compute(self.precision, inputs.device.type):  # the loss too, as torch's AMP says
            try:
                output, recorded = self._forward_graph(inputs, replica, keep)
            except Exception as error:  # name the stage, its blocks and the input it got
                raise StageError(
                    f"stage {self.stage} (blocks {self.block_range[0]}..{self.block_range[1] - 1}) "
                    f"failed in forward on input of shape {tuple(inputs.shape)} dtype "
                    f"{inputs.dtype}: {error}"
                ) from error
            if self.is_last:
                if target is None:
                    raise StageError(f"last stage {self.stage} got no target for micro-batch "
                                     f"{key[0]}")
                loss = self._loss(output, target, rows, batch_rows, key)
        if self.is_last:
            self._keep(key, _Stash(inputs, loss if keep else None, rng, rows, target, replica,
                                   recorded))
            return None
        self._keep(key, _Stash(inputs, output if keep else None, rng, rows, None, replica, recorded))
        return output.detach()

    def _forward_graph(self, inputs: Tensor, replica: nn.Module | None,
                       keep: bool) -> tuple[Tensor, list[RecordedOutput] | None]:
        """The stage's output, with a graph if ``keep`` (recording for a split backward)."""
        if keep and self.split_backward:
            with recording(self._module(replica)) as recorded:
                return self._run(inputs, replica), recorded
        if keep:
            return self._run(inputs, replica), None
        with torch.no_grad():
            return self._run(inputs, replica), None

    def _loss(self, output: Tensor, target: Tensor, rows: int, batch_rows: int, key: Key) -> Tensor:
        loss = self.loss_fn(output, target) * (rows / batch_rows)
        self.loss_log.add(key[0], loss)
        return self._for_backward(loss)

    def forget(self, key: Key) -> None:
        """Drop what the forward of ``key`` kept (and its loss): it runs again (a global
        check undid the update it ran on, :mod:`.global_check`)."""
        stash = self._stash.pop(key, None)
        if stash is not None:
            self._stashed_bytes -= _nbytes(stash)
        if self.is_last:
            self.loss_log.forget(key[0])
        self._recount()

    def _keep(self, key: Key, stash: _Stash) -> None:
        self._stash[key] = stash
        self._stashed_bytes += _nbytes(stash)
        self._recount()
        self.peak_stashed = max(self.peak_stashed, self._alive)
        self.peak_stashed_bytes = max(self.peak_stashed_bytes, self._stashed_bytes)

    def _recount(self) -> None:
        """Tell the rank's count how many micro-batches this stage holds now."""
        alive = len({(k[0], k[2]) for k in self._stash} | {(k[0], k[2]) for k in self._pending})
        self.held.change(alive - self._alive)
        self._alive = alive

    # -- backward ---------------------------------------------------------------------
    def backward(self, microbatch: int, pipeline: int, grad_output: Tensor | None, *,
                 batch_rows: int = 1,
                 recompute_module: Callable[[int], nn.Module | None] | None = None,
                 ) -> Tensor | None:
        """Back-propagate micro-batch ``microbatch``; return the gradient of the stage input.

        A forward that ran without a graph is recomputed first, with the module
        ``recompute_module(piece)`` gives (None: the stage's own, at the live weights).
        """
        grads: list[Tensor] = []
        if self.sharding is not None:  # reduce-scatter at the update's last backward only
            self.sharding.before_backward(microbatch, pipeline)
        for _, stash, output, part in self._unstashed(microbatch, pipeline, grad_output,
                                                      batch_rows, recompute_module):
            self._stashed_bytes -= _nbytes(stash)
            if self.is_last:
                output.backward()
            else:
                torch.autograd.backward(output, part)
            if stash.inputs.requires_grad:
                grad = stash.inputs.grad
                grads.append(grad if grad is not None else torch.zeros_like(stash.inputs))
        self._recount()
        return _joined(grads)

    def _unstashed(self, microbatch: int, pipeline: int, grad_output: Tensor | None,
                   batch_rows: int, recompute_module: Callable[[int], nn.Module | None] | None,
                   ) -> Iterator[tuple[Key, _Stash, Tensor, Tensor | None]]:
        """For each piece of the micro-batch: its stash (taken out), its output with a graph
        (recomputed if the forward kept none) and its rows of ``grad_output`` (None on the last
        stage: the output is the loss)."""
        pieces = [p for p in (0, 1, 2) if (microbatch, p, pipeline) in self._stash]
        if not pieces:
            raise StageError(f"stage {self.stage} has no stashed forward for micro-batch {microbatch}")
        offset = 0
        for piece in pieces:
            key = (microbatch, piece, pipeline)
            stash = self._stash.pop(key)
            output = stash.output
            if output is None:
                replica = recompute_module(piece) if recompute_module is not None else None
                output = self._recompute(stash, batch_rows, replica)
            part = None
            if not self.is_last:
                assert grad_output is not None
                part = grad_output.narrow(0, offset, stash.rows) if len(pieces) > 1 else grad_output
            offset += stash.rows
            yield key, stash, output, part

    def _recompute(self, stash: _Stash, batch_rows: int, replica: nn.Module | None) -> Tensor:
        assert stash.rng_state is not None
        with torch.random.fork_rng(devices=[]), compute(self.precision, stash.inputs.device.type):
            torch.set_rng_state(stash.rng_state)
            if self.split_backward:
                with recording(self._module(replica)) as stash.recorded:
                    output = self._run(stash.inputs, replica)
                stash.module = replica
            else:
                output = self._run(stash.inputs, replica)
            if not self.is_last:
                return output
            assert stash.target is not None
            return self._for_backward(self.loss_fn(output, stash.target)
                                      * (stash.rows / batch_rows))

    # -- split backward (I, then W) ---------------------------------------------------------
    def backward_input(self, microbatch: int, pipeline: int, grad_output: Tensor | None, *,
                       batch_rows: int = 1,
                       recompute_module: Callable[[int], nn.Module | None] | None = None,
                       ) -> Tensor | None:
        """``I``: the gradient of the stage input only; what ``W`` needs is kept (module
        docstring). Arguments as for :meth:`backward`."""
        grads: list[Tensor] = []
        if self.sharding is not None:  # FSDP2 gathers before it and reduces nothing
            self.sharding.before_input_gradient()
        for key, stash, output, part in self._unstashed(microbatch, pipeline, grad_output,
                                                        batch_rows, recompute_module):
            grad = self._input_gradient(key, stash, output, part)  # its bytes count until W
            if grad is not None:
                grads.append(grad)
        return _joined(grads)

    def _input_gradient(self, key: Key, stash: _Stash, output: Tensor,
                        grad: Tensor | None) -> Tensor | None:
        if stash.recorded is None:
            raise StageError(f"stage {self.stage}: micro-batch {key[0]}'s forward recorded nothing "
                             f"for a split backward (the stage was built with "
                             f"split_backward=False)")
        found, pending = input_gradient(self._module(stash.module), stash.inputs, output, grad,
                                        stash.recorded)
        self._pending[key] = _Pending(pending, _nbytes(stash))
        return found

    def backward_weight(self, microbatch: int, pipeline: int) -> None:
        """``W``: the weight gradients of micro-batch ``microbatch`` (after its ``I``),
        accumulated into ``.grad``; releases what the ``I`` kept."""
        pieces = [p for p in (0, 1, 2) if (microbatch, p, pipeline) in self._pending]
        if not pieces:
            raise StageError(f"stage {self.stage}: W of micro-batch {microbatch} before its I")
        pending = [self._pending.pop((microbatch, piece, pipeline)) for piece in pieces]
        self._stashed_bytes -= sum(each.nbytes for each in pending)
        if self.sharding is not None:  # gathered block by block; reduced at the update's last W
            self.sharding.weight_gradient(microbatch, pipeline, [each.weights for each in pending])
        else:
            for each in pending:
                weight_gradient(each.weights)
        self._recount()

    def _module(self, replica: nn.Module | None) -> nn.Module:
        return self.module if replica is None else replica

    def _for_backward(self, weighted: Tensor) -> Tensor:
        """The batch-weighted loss as one update must see it (``loss_scale``, module docstring)."""
        return weighted * self.loss_scale if self.loss_scale != 1.0 else weighted

    @property
    def in_flight(self) -> int:
        return len(self._stash) + len(self._pending)


def _joined(grads: list[Tensor]) -> Tensor | None:
    """The input gradient of a micro-batch from its pieces' (None: the stage input needs none)."""
    if not grads:
        return None
    return grads[0] if len(grads) == 1 else torch.cat(grads)


def _nbytes(stash: _Stash) -> int:
    total = stash.inputs.numel() * stash.inputs.element_size()
    if stash.output is not None:
        total += stash.output.numel() * stash.output.element_size()
    return total
