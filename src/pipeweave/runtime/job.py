"""Job: everything a rank needs to build its part of a run, as picklable factories.

Processes are started with the ``spawn`` method (or by torchrun), so models, data and
optimizers travel as *factories* that every rank calls itself: the built-in ones below, or any
picklable callable of the user's (a top-level function, a ``functools.partial``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..models import ModelSpec, build_model
from ..precision import check_precision
from .communication.sharded import is_sharded
from .options import AdvanceOptions, CheckpointOptions
from ..planner.plan import Plan

__all__ = ["Job", "BuiltinModel", "BuiltinData", "OptimizerFactory", "DTYPES", "IMPLEMENTATIONS"]

Batch = tuple[Tensor, Tensor]
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class BuiltinModel:
    """Factory for a registered model (``pipeweave.models.build_model``), on the meta device:
    every rank makes real only its own stages' blocks (:meth:`ModelSpec.stage_blocks`)."""

    name: str = "gpt-tiny"
    seed: int = 0
    dtype: str = "float32"
    overrides: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> ModelSpec:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} unsupported; use one of {sorted(DTYPES)}")
        return build_model(self.name, seed=self.seed, dtype=DTYPES[self.dtype], meta=True,
                           **self.overrides)

    def data(self, batch_size: int, *, seq_len: int | None = None,
             seed: int = 0) -> "BuiltinData":
        """The model's own dataset (``digits`` where it names none) at ``batch_size``; a
        sequence dataset at ``seq_len``, by default the model's (after its overrides)."""
        from ..data import SEQUENCE_DATASETS
        from ..models import default_seq_len

        dataset = self().dataset or "digits"
        if dataset not in SEQUENCE_DATASETS:
            seq_len = None
        elif seq_len is None:
            seq_len = default_seq_len(self.name, **self.overrides)
        return BuiltinData(dataset, batch_size=batch_size, seq_len=seq_len, seed=seed)


@dataclass(frozen=True)
class BuiltinData:
    """Factory for a registered dataset stream (``pipeweave.data.build_dataset``)."""

    name: str
    batch_size: int
    seq_len: int | None = None
    seed: int = 0
    dtype: str = "float32"

    def __call__(self) -> Iterable[Batch]:
        from ..data import build_dataset

        return build_dataset(self.name, batch_size=self.batch_size, seq_len=self.seq_len,
                             seed=self.seed, dtype=DTYPES[self.dtype])


_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "nadam": torch.optim.NAdam,
}


IMPLEMENTATIONS = ("auto", "fused", "foreach", "loop")
"""How torch runs an optimizer's step: ``fused`` (one kernel per step, SGD/Adam/AdamW/Adagrad
on the devices torch has kernels for), ``foreach`` (one kernel per operation over all
tensors), ``loop`` (one per tensor), ``auto`` (fused where torch offers it for this optimizer,
device and dtype, else torch's own default). The update rule is the same in all four; the
last bits of a result can differ between them (floating-point order)."""


@dataclass(frozen=True)
class OptimizerFactory:
    """``torch.optim`` optimizer by name with keyword arguments, e.g. ``("adam", lr=1e-3)``.

    ``implementation`` picks how torch runs the step (:data:`IMPLEMENTATIONS`); ``foreach``
    or ``fused`` given in ``kwargs`` are passed as they are and need ``"auto"``.
    """

    name: str = "adam"
    kwargs: dict[str, Any] = field(default_factory=lambda: {"lr": 1e-3})
    implementation: str = "auto"

    def __post_init__(self) -> None:
        if self.name not in _OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}; choose one of {sorted(_OPTIMIZERS)}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"optimizer implementation {self.implementation!r}; choose one of "
                             f"{', '.join(IMPLEMENTATIONS)}")
        chosen = sorted({"foreach", "fused"} & set(self.kwargs))
        if chosen and self.implementation != "auto":
            raise ValueError(f"optimizer {self.name}: {chosen[0]}= is given and implementation="
                             f"{self.implementation!r} too; give one of them")
        if self.implementation in ("fused", "foreach") and not self._accepts(self.implementation):
            raise ValueError(f"torch.optim.{_OPTIMIZERS[self.name].__name__} has no "
                             f"{self.implementation} implementation; use auto or loop")
        lr = self.kwargs.get("lr")
        if isinstance(lr, float) and not math.isfinite(lr):
            raise ValueError(f"optimizer {self.name}: lr={lr} is not finite; give a finite "
                             f"--lr > 0, e.g. 1e-3")
        # torch checks its hyper-parameters when the optimizer is built, i.e. inside every rank;
        # build one here on a stand-in parameter so a bad value stops the run before launch.
        try:
            _OPTIMIZERS[self.name]([torch.zeros(1, requires_grad=True)], **self.kwargs)
        except (ValueError, TypeError) as error:
            settings = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
            raise ValueError(f"optimizer {self.name} with {settings}: {error}; give values "
                             f"torch.optim.{_OPTIMIZERS[self.name].__name__} accepts (e.g. a "
                             f"finite --lr > 0)") from None

    def __call__(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = list(params)
        build = _OPTIMIZERS[self.name]
        if self.implementation == "auto":
            if ({"foreach", "fused", "differentiable"} & set(self.kwargs)
                    or not self._accepts("fused") or any(map(is_sharded, params))):
                # torch has no fused step for sharded (DTensor) parameters
                return build(params, **self.kwargs)
            try:  # torch refuses fused when a parameter's device or dtype has no kernel
                return build(params, **self.kwargs, fused=True)
            except RuntimeError:
                return build(params, **self.kwargs)
        if self.implementation == "loop":
            return build(params, **self.kwargs, foreach=False)
        return build(params, **self.kwargs, **{self.implementation: True})

    def _accepts(self, flag: str) -> bool:
        return flag in inspect.signature(_OPTIMIZERS[self.name].__init__).parameters


@dataclass(frozen=True)
class Job:
    """A training run as data.

    Attributes:
        plan: the split and schedule.
        steps: iterations (optimizer steps per stage for flush schedules) to run.
        model: returns the :class:`ModelSpec` (called on every rank; must be deterministic).
            Its blocks may be on the meta device (each rank then makes real only its own
            stages', :meth:`ModelSpec.stage_blocks`) or real (each rank copies its own).
            Its blocks train in train mode whatever mode they come in (a ``from_pretrained``
            model comes in eval mode): dropout is on in both executors.
        data: returns an iterable of ``(inputs, targets)`` batches (called on every rank that
            needs data; every call must yield the same batches).
        optimizer: builds a ``torch.optim`` optimizer from a stage's parameters.
        seed: seeds torch's RNG on every rank (dropout etc.).
        device: ``"cpu"`` or ``"cuda"``: rank r on ``cuda:(local_rank % GPUs)``, NCCL when
            every local rank has a GPU, else the ranks share them over gloo; the
            single-process executor puts every rank on ``cuda:0`` (:mod:`pipeweave.devices`).
        timeout_s: how long a rank waits for a peer before failing with a clear error.
        record_timeline: record start/end of every action.
        return_parameters: include every rank's final parameters in the results (tests).
        progress: show a progress bar (on the rank that holds the last stage).
        checkpoint: when to write checkpoints and what to resume from (None: neither); see
            :mod:`pipeweave.runtime.checkpoint.recovery`.
        apc: automatic precision compression (WPipe §A.3) of the float32/float64 activations
            and gradients sent between ranks: fp16 with a power-of-two scaler (relative error
            at most 2**-11 per element), full precision when that would overflow or underflow;
            see :mod:`pipeweave.apc`. Both executors apply it identically.
        advance: AvgPipe's advance chosen at run time by Algorithm 1 (None: the plan's fixed
            ``advance`` option); see :mod:`pipeweave.runtime.advance.online`.
        clip_grad_norm: clip the global gradient norm of every update to this value, as
            ``torch.nn.utils.clip_grad_norm_`` on the whole model would (None: no clipping);
            synchronous schedules, see :mod:`pipeweave.runtime.execution.clipping`.
        track_allocations: measure the peak bytes of live tensors on every rank at the
            allocator (``RankResult.peak_allocated_bytes``; on CPU through torch's profiler,
            which slows the run: for short measuring runs); see
            :mod:`pipeweave.runtime.observation.allocations`. Distributed runs only.
        precision: ``"full"`` (everything in the model's dtype), ``"bf16-mixed"`` (float32
            master weights, gradients and optimizer state; every stage's forward and loss under
            ``torch.autocast(bfloat16)``) or ``"bf16"`` (parameters, optimizer state and
            activations in bfloat16); fp16 is refused with the reason. See
            :mod:`pipeweave.precision` and docs/precision.md.
        count_activations: count the activation bytes each rank holds between forwards and
            backwards (:class:`~.observation.memory.ActivationMeter`) and report the peak and
            the model state bytes per rank (``RankResult.peak_activation_bytes``,
            ``state_bytes``): the same on CPU and GPU, unlike the process's peak memory.
        eval_every: every this many steps, and after the last, each rank copies its stages'
            weights at the iteration boundary (``RankResult.snapshots``) for a held-out loss
            (:mod:`pipeweave.runtime.observation.held_out`); 0: never. Synchronous
            schedules, one pipeline.
        prefetch_gathers: with ``Plan.shard``, start each action's first all-gather one
            action early, in the order of the rank's program
            (:mod:`pipeweave.runtime.execution.gathers`; bit for bit the same training);
            False: FSDP2's own order only (each block gathered when its hook fires). Refused
            False without ``Plan.shard`` (there is nothing to gather).
    """

    plan: Plan
    steps: int
    model: Callable[[], ModelSpec]
    data: Callable[[], Iterable[Batch]]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    seed: int = 0
    device: str = "cpu"
    timeout_s: float = 60.0
    record_timeline: bool = True
    return_parameters: bool = False
    progress: bool = False
    checkpoint: CheckpointOptions | None = None
    apc: bool = False
    advance: AdvanceOptions | None = None
    clip_grad_norm: float | None = None
    track_allocations: bool = False
    precision: str = "full"
    count_activations: bool = False
    eval_every: int = 0
    prefetch_gathers: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: never), got {self.eval_every}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not isinstance(self.prefetch_gathers, bool):
            raise TypeError(f"prefetch_gathers must be True or False, got {self.prefetch_gathers!r}")
        if not isinstance(self.apc, bool):
            raise TypeError(f"apc must be True or False, got {self.apc!r}")
        dtype = DTYPES.get(getattr(self.model, "dtype", "float32"), torch.float32)
        check_precision(self.precision, dtype=dtype, apc=self.apc)


def take(stream: Iterable[Batch], count: int) -> Iterator[Batch]:
    iterator = iter(stream)
    for _ in range(count):
        yield next(iterator)
