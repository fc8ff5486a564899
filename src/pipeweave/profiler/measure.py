"""Measure every block of a model with stock PyTorch: times, activation and memory sizes.

For block ``i`` (its input ``x_i`` is the output of blocks ``0..i-1`` on the same batch)::

    forward    run block(x_i)                           warm-up runs, then the median of
    backward   run output.backward(gradient)            `repeats` timed runs each
               (the last block: loss_fn(output, targets).backward(), so the loss is in it)
    output_bytes        bytes of the output tensor
    activation_bytes    bytes autograd saves for the backward (saved-tensor hooks; each
                        storage counted once; the block's parameters and buffers left out:
                        a layer saves its weight for the backward, but that is the one
                        copy a rank holds anyway, not a per-micro-batch cost), i.e. what a
                        stage stashes per micro-batch
    parameter_bytes     bytes of the block's parameters
    optimizer_bytes     bytes of the optimizer state after one step on a deep copy
    update              seconds of one optimizer step on that copy (median of `repeats`
                        steps after the first, which allocates the state)
    peak_memory_bytes   most memory allocated during forward+backward above what was
                        allocated before it (CUDA: the allocator's peak; CPU: torch's CPU
                        allocator as the profiler reports it, profile_memory=True)
    pending_bytes       bytes a split backward keeps from its I to its W besides the
                        activations: the gradients of the parameter-holding modules' outputs
                        (:mod:`pipeweave.split_backward`)
    recorded_bytes      bytes a split-backward stage keeps from the forward to W besides
                        activation_bytes: the parameter-holding modules' outputs that autograd
                        does not save itself (e.g. a projection feeding a residual add)

The profile's ``ties`` list the parameters several blocks share (``ModelSpec.tied``: tied word
embeddings), with the blocks that hold them and their bytes; each block was measured alone, so
every holder counts the parameter in its ``parameter_bytes``.

``apc_bytes_per_second``: float32 bytes per second through APC's encode and decode, timed on a
tensor the size of the largest block output (:mod:`.apc_rate`).

On CUDA every timed region is bracketed by ``torch.cuda.synchronize()`` so kernels are
counted where they run, not where they are queued.

``precision`` (:mod:`pipeweave.precision`) measures what the runtime will run: ``bf16-mixed``
runs every block's forward (and the last block's loss) under ``torch.autocast(bfloat16)``, so
times, activation and output bytes are autocast's while parameters and optimizer state stay
float32; ``bf16`` measures bfloat16 copies of the blocks on bfloat16 inputs.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple, TypedDict, Unpack

import torch
from torch import Tensor, nn

from ..devices import require_device
from ..models import ModelSpec
from ..precision import cast_input, cast_module, check_precision, compute
from ..saved_tensors import observing_saved
from .tp_facts import tp_facts
from ..split_backward import input_gradient, recording, weight_gradient
from ..host import machine_cores
from .apc_rate import measure_apc_rate
from .profile import EXCLUDED, BlockProfile, Profile, TieProfile
from .rounds import interleaved_rounds

__all__ = ["profile_model", "profile_model_sizes", "profile_block", "profile_builtin",
           "profile_builtin_sizes", "tensor_bytes", "OPTIMIZERS"]

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}
"""Optimizers whose state size the profiler can measure, by name."""


def tensor_bytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class TimingOptions(TypedDict, total=False):
    """The keyword options of :func:`profile_model_sizes` (its defaults), which
    :func:`profile_model` passes on."""

    device: str
    warmup: int
    repeats: int
    optimizer: str
    threads: int | None
    precision: str


class BuiltinOptions(TimingOptions, total=False):
    """The keyword options of :func:`profile_builtin_sizes` (its defaults), which
    :func:`profile_builtin` passes on."""

    seq_len: int | None
    seed: int
    overrides: dict[str, Any] | None
    colocated_ranks: int


def profile_model(spec: ModelSpec, inputs: Tensor, targets: Tensor | None = None,
                  **options: Unpack[TimingOptions]) -> Profile:
    """Profile every block of ``spec`` on one micro-batch ``inputs`` (module docstring).

    ``targets`` lets the last block's backward start from the model's loss; without them it
    starts from a gradient of ones. ``threads`` sets torch's intra-op threads while measuring
    (on CPU give what one rank will use: cores / ranks per machine); ``precision`` as the run
    will use it (module docstring); the other ``options`` and their defaults are
    :func:`profile_model_sizes`'.
    """
    return profile_model_sizes(spec, [(inputs, targets)], **options)[0]


def profile_model_sizes(
    spec: ModelSpec,
    batches: Sequence[tuple[Tensor, Tensor | None]],
    *,
    device: str = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    optimizer: str = "adam",
    threads: int | None = None,
    precision: str = "full",
) -> tuple[Profile, ...]:
    """:func:`profile_model` of each ``(inputs, targets)`` micro-batch of ``batches`` (one
    per micro-batch size), one profile each, their timed runs interleaved: each block's
    forward and backward are timed round by round, one run of every size a round, so that
    a load that comes and goes while profiling slows every size alike and the sizes' ratio
    (:mod:`pipeweave.auto.scaling`'s lines) stays what the device gives (``pipeweave auto``:
    profiled one size after the other under a varying load, gpt-tiny's profiles at 1 and 4
    samples disagreed 2x between runs)."""
    if not batches:
        raise ValueError("profile_model_sizes needs at least one (inputs, targets) batch")
    check_precision(precision, dtype=next((p.dtype for b in spec.blocks for p in b.parameters()
                                           if p.is_floating_point()), torch.float32))
    if threads is None:
        return _profile_model(spec, batches, device, warmup, repeats, optimizer, precision)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _profile_model(spec, batches, device, warmup, repeats, optimizer, precision)
    finally:
        torch.set_num_threads(previous)


class _Autocast(nn.Module):
    """A block whose forward runs under the precision's autocast (``bf16-mixed``)."""

    def __init__(self, block: nn.Module, precision: str) -> None:
        super().__init__()
        self.block = block
        self.precision = precision

    def forward(self, x: Tensor) -> Tensor:
        with compute(self.precision, x.device.type):
            out: Tensor = self.block(x)
        return out


def _in_precision(block: nn.Module, precision: str) -> nn.Module:
    block = cast_module(block, precision)
    return _Autocast(block, precision) if precision == "bf16-mixed" else block


def _loss_in_precision(loss_fn: Callable[[Tensor, Tensor], Tensor],
                       precision: str) -> Callable[[Tensor, Tensor], Tensor]:
    def loss(output: Tensor, target: Tensor) -> Tensor:
        with compute(precision, output.device.type):
            return loss_fn(output, target)
    return loss


def _profile_model(spec: ModelSpec, batches: Sequence[tuple[Tensor, Tensor | None]],
                   device: str, warmup: int, repeats: int, optimizer: str,
                   precision: str) -> tuple[Profile, ...]:
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r} for profiling; choose one of "
                         f"{sorted(OPTIMIZERS)}")
    require_device(device)
    target = torch.device(device)
    blocks = [_in_precision(copy.deepcopy(block).to(target).train(), precision)
              for block in spec.blocks]
    xs = [cast_input(inputs.to(target), precision) for inputs, _ in batches]
    ys = [cast_input(y.to(target), precision) if y is not None else None for _, y in batches]
    model_loss = _loss_in_precision(spec.loss_fn, precision)
    found: list[list[tuple[BlockProfile, float, tuple[Any, ...]]]] = [[] for _ in batches]
    for index, (name, block) in enumerate(zip(spec.block_names, blocks)):
        last = index == len(blocks) - 1
        loss_fns = [model_loss if last and y is not None else None for y in ys]
        runs = _timed_runs(block, xs, loss_fns, ys, warmup=warmup, repeats=repeats)
        for k, (x, y, loss_fn) in enumerate(zip(xs, ys, loss_fns)):
            profiled, spread = _block_profile(block, x, runs[k], name=name, loss_fn=loss_fn,
                                              targets=y, repeats=repeats, optimizer=optimizer)
            with torch.no_grad():
                xs[k] = block(x)
            found[k].append((profiled, spread, _signature(getattr(block, "block", block), x,
                                                          xs[k], last=loss_fn is not None)))
    return tuple(_assembled(spec, blocks, inputs, rows, device=device, target=target,
                            warmup=warmup, repeats=repeats, optimizer=optimizer,
                            precision=precision)
                 for (inputs, _), rows in zip(batches, found))


def _assembled(spec: ModelSpec, blocks: list[nn.Module], inputs: Tensor,
               rows: list[tuple[BlockProfile, float, tuple[Any, ...]]], *, device: str,
               target: torch.device, warmup: int, repeats: int, optimizer: str,
               precision: str) -> Profile:
    """The profile of one micro-batch size from its blocks' profiles, spreads and
    signatures (:func:`unalike_twins`)."""
    profiles = [profiled for profiled, _, _ in rows]
    spreads = {profiled.name: spread for profiled, spread, _ in rows}
    largest = max(p.output_bytes for p in profiles)
    return Profile(
        blocks=tuple(profiles), ties=_ties(spec, blocks), model=spec.name,
        batch_size=int(inputs.shape[0]),
        apc_bytes_per_second=measure_apc_rate(largest, device=device, warmup=warmup,
                                              repeats=repeats),
        device=_device_name(target), source="measured",
        input_bytes=float(tensor_bytes(cast_input(inputs, precision))),
        metadata={"precision": precision, "warmup": warmup, "repeats": repeats, "statistic": "median",
                  "optimizer": optimizer, "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "cores": machine_cores(),
                  "peak_memory": "measured", "activation_bytes": EXCLUDED,
                  "spread": spreads,
                  "warnings": unalike_twins(profiles, [s for _, _, s in rows])},
    )


def _ties(spec: ModelSpec, blocks: list[nn.Module]) -> tuple[TieProfile, ...]:
    """The model's shared parameters (``ModelSpec.tied``, the rule the runtime's tie sum
    uses), sized as the blocks were measured (in the profiled precision)."""
    found = []
    for names, holders in zip(spec.tied, spec.tied_blocks()):
        block, _, rest = names[0].partition(".")
        parameter = getattr(blocks[int(block)], "block", blocks[int(block)]).get_parameter(rest)
        found.append(TieProfile(blocks=holders, parameter_bytes=float(tensor_bytes(parameter)),
                                names=names))
    return tuple(found)


SPREAD_GOAL = 0.10
"""Repeat a block's timed runs (up to ``MAX_REPEAT_FACTOR`` times the asked count) until the
interquartile range of its forward+backward times is within this share of their median."""
MAX_REPEAT_FACTOR = 4
ALIKE_RATIO = 3.0
"""Blocks of the same type, parameter shapes and input/output shapes whose times differ by
more than this factor are reported: the machine was busy, or the measurement is wrong."""


def _spread(times: list[float]) -> float:
    """Interquartile range over the median (0 for fewer than 4 samples)."""
    if len(times) < 4:
        return 0.0
    quartiles = statistics.quantiles(times, n=4)
    middle = statistics.median(times)
    return (quartiles[2] - quartiles[0]) / middle if middle > 0 else 0.0


def _signature(block: nn.Module, inputs: Tensor, output: Tensor, last: bool) -> tuple[Any, ...]:
    return (type(block).__name__, tuple(tuple(p.shape) for p in block.parameters()),
            tuple(inputs.shape), tuple(output.shape), last)


def unalike_twins(profiles: list[BlockProfile], signatures: list[tuple[Any, ...]]) -> list[str]:
    """One line per group of alike blocks whose measured times differ by > ``ALIKE_RATIO``."""
    groups: dict[tuple[Any, ...], list[BlockProfile]] = {}
    for profile, signature in zip(profiles, signatures):
        groups.setdefault(signature, []).append(profile)
    warnings = []
    for members in groups.values():
        if len(members) < 2:
            continue
        fastest = min(members, key=lambda b: b.forward + b.backward)
        slowest = max(members, key=lambda b: b.forward + b.backward)
        fast, slow = fastest.forward + fastest.backward, slowest.forward + slowest.backward
        if fast > 0 and slow / fast > ALIKE_RATIO:
            warnings.append(
                f"blocks {fastest.name} and {slowest.name} are alike but took "
                f"{1e3 * fast:.2f} and {1e3 * slow:.2f} ms (x{slow / fast:.0f}): the machine was "
                f"probably busy; profile again on a quiet machine or with fewer --threads, or "
                f"the plan will be skewed")
    return warnings


def profile_block(
    block: nn.Module,
    inputs: Tensor,
    *,
    name: str,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    targets: Tensor | None = None,
    warmup: int = 2,
    repeats: int = 5,
    optimizer: str = "adam",
) -> BlockProfile:
    """Measure one block on one input (see the module docstring)."""
    return measure_block(block, inputs, name=name, loss_fn=loss_fn, targets=targets,
                         warmup=warmup, repeats=repeats, optimizer=optimizer)[0]


def measure_block(
    block: nn.Module,
    inputs: Tensor,
    *,
    name: str,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    targets: Tensor | None = None,
    warmup: int = 2,
    repeats: int = 5,
    optimizer: str = "adam",
) -> tuple[BlockProfile, float]:
    """:func:`profile_block` and the spread of its timed runs (:func:`_spread`), repeated
    until the spread is within ``SPREAD_GOAL`` or ``MAX_REPEAT_FACTOR * repeats`` runs."""
    (runs,) = _timed_runs(block, [inputs], [loss_fn], [targets], warmup=warmup, repeats=repeats)
    return _block_profile(block, inputs, runs, name=name, loss_fn=loss_fn, targets=targets,
                          repeats=repeats, optimizer=optimizer)


def _block_profile(block: nn.Module, inputs: Tensor, runs: list[_Run], *, name: str,
                   loss_fn: Callable[[Tensor, Tensor], Tensor] | None,
                   targets: Tensor | None, repeats: int,
                   optimizer: str) -> tuple[BlockProfile, float]:
    """The block's profile on ``inputs`` from its timed ``runs`` (their medians) and the
    facts measured here, and the runs' spread."""
    parameters = sum(tensor_bytes(p) for p in block.parameters())
    optimizer_bytes, update = _optimizer_step(block, inputs, loss_fn, targets, optimizer, repeats)
    input_grad, weight_grad, pending, recorded = _split_times(block, inputs, loss_fn, targets,
                                                              repeats)
    spread = _spread([run.forward + run.backward for run in runs])
    tp = tp_facts(block, inputs)
    return BlockProfile(
        name=name,
        forward=statistics.median(run.forward for run in runs),
        backward=statistics.median(run.backward for run in runs),
        output_bytes=runs[-1].output_bytes,
        activation_bytes=runs[-1].saved_bytes,
        parameter_bytes=parameters,
        optimizer_bytes=optimizer_bytes,
        update=update,
        weight_grad=weight_grad,
        input_grad=input_grad,
        peak_memory_bytes=_peak_memory(block, inputs, loss_fn, targets),
        pending_bytes=pending,
        recorded_bytes=recorded,
        tp_split_parameter_bytes=tp.split_parameter_bytes,
        tp_split_activation_bytes=min(tp.split_saved_bytes, runs[-1].saved_bytes),
        tp_forward_reduces=tp.forward_reduces,
        tp_backward_reduces=tp.backward_reduces,
        tp_split_output_bytes=tp.split_output_bytes,
    ), spread


class _Run(NamedTuple):
    """One timed forward and backward of a block."""

    forward: float
    backward: float
    saved_bytes: int
    """What the forward saved for the backward (the block's own weights left out)."""
    output_bytes: int


def _timed_runs(block: nn.Module, inputs: Sequence[Tensor],
                loss_fns: Sequence[Callable[[Tensor, Tensor], Tensor] | None],
                targets: Sequence[Tensor | None], *, warmup: int,
                repeats: int) -> list[list[_Run]]:
    """The timed runs of the block on each of ``inputs`` (one per micro-batch size), after
    ``warmup`` untimed rounds: ``repeats`` rounds, more (up to ``MAX_REPEAT_FACTOR *
    repeats``) while any size's spread exceeds ``SPREAD_GOAL``. A round runs every size once
    (:func:`~pipeweave.profiler.rounds.interleaved_rounds`), so each size has as many runs as
    the others, taken under the same load, and their medians come from the same rounds."""
    weights = frozenset(t.untyped_storage().data_ptr()
                        for t in (*block.parameters(), *block.buffers()))

    def more(done: int, runs: Sequence[Sequence[_Run]]) -> bool:
        if done < warmup + repeats:
            return True
        return (done < warmup + MAX_REPEAT_FACTOR * repeats
                and any(_spread([run.forward + run.backward for run in size]) > SPREAD_GOAL
                        for size in runs))

    return interleaved_rounds([partial(_timed_run, block, x, loss_fn, y, weights)
                               for x, loss_fn, y in zip(inputs, loss_fns, targets)],
                              warmup=warmup, more=more)


def _timed_run(block: nn.Module, inputs: Tensor,
               loss_fn: Callable[[Tensor, Tensor], Tensor] | None, targets: Tensor | None,
               weights: frozenset[int]) -> _Run:
    cuda = inputs.device.type == "cuda"
    record: list[int] = []
    x = _leaf(inputs)
    block.zero_grad(set_to_none=True)
    _sync(cuda)
    started = time.perf_counter()
    with _counter(record, weights):
        out = block(x)
        loss = loss_fn(out, targets) if loss_fn is not None and targets is not None else None
    _sync(cuda)
    middle = time.perf_counter()
    _backward(out, loss)
    _sync(cuda)
    finished = time.perf_counter()
    return _Run(middle - started, finished - middle, sum(record), tensor_bytes(out))


def _leaf(inputs: Tensor) -> Tensor:
    """A fresh leaf input; floating inputs require grad, as a stage's received activation does."""
    x = inputs.detach()
    return x.requires_grad_(True) if x.is_floating_point() else x


def _counter(record: list[int], excluded: frozenset[int] = frozenset()
             ) -> AbstractContextManager[None]:
    """Inside: each saved storage's bytes added to ``record`` once, except the storages in
    ``excluded`` (the block's parameters and buffers, by data pointer)."""
    seen: set[tuple[int, int]] = set()

    def count(tensor: Tensor) -> None:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[0] not in excluded and key not in seen:
            seen.add(key)
            record.append(storage.nbytes())

    return observing_saved(count)


def _backward(out: Tensor, loss: Tensor | None) -> None:
    if loss is not None:
        loss.backward()
    elif out.requires_grad:
        out.backward(torch.ones_like(out))


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _optimizer_step(block: nn.Module, inputs: Tensor,
                    loss_fn: Callable[[Tensor, Tensor], Tensor] | None, targets: Tensor | None,
                    optimizer: str, repeats: int) -> tuple[int, float]:
    """State bytes after one step, and the median time of ``repeats`` further steps."""
    params = [p for p in block.parameters() if p.requires_grad]
    if not params:
        return 0, 0.0
    clone = copy.deepcopy(block)
    opt = OPTIMIZERS[optimizer](clone.parameters())
    out = clone(_leaf(inputs))
    _backward(out, loss_fn(out, targets) if loss_fn is not None and targets is not None else None)
    cuda = inputs.device.type == "cuda"
    times = []
    for run in range(repeats + 1):
        _sync(cuda)
        started = time.perf_counter()
        opt.step()
        _sync(cuda)
        if run:
            times.append(time.perf_counter() - started)
    state = sum(tensor_bytes(value) for entry in opt.state.values() for value in entry.values()
                if isinstance(value, Tensor))
    return state, statistics.median(times)


def _split_times(block: nn.Module, inputs: Tensor,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] | None, targets: Tensor | None,
                 repeats: int) -> tuple[float, float, int, int]:
    """Median times of the two halves of a split backward (``I``, ``W``,
    :mod:`pipeweave.split_backward`) over ``repeats`` runs after one warm-up, the bytes of
    output gradients held from ``I`` to ``W`` and of the recorded outputs that autograd does
    not save (held from the forward to ``W``); ``I`` of a block without parameters is its
    whole backward and its ``W`` 0."""
    cuda = inputs.device.type == "cuda"
    inputs_times, weight_times = [], []
    for run in range(repeats + 1):
        x = _leaf(inputs)
        saved: set[int] = set()
        with recording(block) as recorded, _storages(saved):
            out = block(x)
            loss = (loss_fn(out, targets) if loss_fn is not None and targets is not None
                    else None)
        start = loss if loss is not None else out
        if not start.requires_grad:
            return 0.0, 0.0, 0, 0
        unsaved = {r.output.untyped_storage().data_ptr(): r.output.untyped_storage().nbytes()
                   for r in recorded
                   if r.output.untyped_storage().data_ptr() not in saved}
        _sync(cuda)
        began = time.perf_counter()
        _, pending = input_gradient(block, x, start, None if loss is not None
                                    else torch.ones_like(out), recorded)
        _sync(cuda)
        middle = time.perf_counter()
        held = sum(tensor_bytes(gradient) for _, gradient, _ in pending.parts)
        weight_gradient(pending)
        _sync(cuda)
        if run:
            inputs_times.append(middle - began)
            weight_times.append(time.perf_counter() - middle)
    block.zero_grad(set_to_none=True)
    has_weights = any(p.requires_grad for p in block.parameters())
    return (statistics.median(inputs_times),
            statistics.median(weight_times) if has_weights else 0.0, held, sum(unsaved.values()))


def _storages(found: set[int]) -> AbstractContextManager[None]:
    """Inside: each saved tensor's storage (data pointer) added to ``found``."""
    return observing_saved(lambda tensor: found.add(tensor.untyped_storage().data_ptr()))


def _peak_memory(block: nn.Module, inputs: Tensor, loss_fn: Callable[[Tensor, Tensor], Tensor] | None,
                 targets: Tensor | None) -> int:
    block.zero_grad(set_to_none=True)
    if inputs.device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _forward_backward(block, inputs, loss_fn, targets)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with memory_profiler() as profiler:
            _forward_backward(block, inputs, loss_fn, targets)
        peak = allocated_peak(profiler)
    block.zero_grad(set_to_none=True)
    return max(0, int(peak))


def _forward_backward(block: nn.Module, inputs: Tensor,
                      loss_fn: Callable[[Tensor, Tensor], Tensor] | None,
                      targets: Tensor | None) -> None:
    out = block(_leaf(inputs))
    _backward(out, loss_fn(out, targets) if loss_fn is not None and targets is not None else None)


def memory_profiler() -> torch.profiler.profile:
    """A CPU profiler that records the allocator's events (read them with
    :func:`allocated_peak`), without kineto's ``profiler_start``/``profiler_stop`` lines on
    stderr (its log level is read when the profiler first starts)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True)


def allocated_peak(profiler: torch.profiler.profile) -> int:
    """Most bytes alive at once, from the CPU allocator's events of a :func:`memory_profiler`
    run (replayed in time order; ties keep the recorded order)."""
    results = profiler.profiler.kineto_results if profiler.profiler is not None else None
    if results is None:
        return 0
    changes = sorted(((event.start_ns(), event.nbytes())  # type: ignore[attr-defined]
                      for event in results.events()
                      if event.name() == "[memory]" and event.device_type() == _CPU),
                     key=lambda change: change[0])
    alive = peak = 0
    for _, nbytes in changes:
        alive += nbytes
        peak = max(peak, alive)
    return peak


_CPU = torch.autograd.DeviceType.CPU


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def profile_builtin(name: str, *, batch_size: int = 4,
                    **options: Unpack[BuiltinOptions]) -> Profile:
    """Profile a registered model (``pipeweave.models.build_model``) on one batch of its
    default dataset; ``batch_size`` should be the micro-batch size you will train with.

    ``colocated_ranks`` > 1: use the local rank count when the ranks will share fewer cores
    than there are ranks. The blocks are measured alone (the times a rank computing on a core
    of its own takes); then whole training steps are timed alone and while
    ``colocated_ranks - 1`` neighbours train the same model (``profiler.colocated``). The
    times stay as measured; ``metadata`` records ``colocated_ranks``, ``cores``,
    ``colocated_slowdown`` (the ratio of the step times) and ``sharing_overhead`` (that ratio
    over the ideal split ``ranks / cores``), which the planner applies when it simulates the
    ranks sharing the cores (``PlanRequest(shared_cores=...)``). ``precision``: as the run
    will train (module docstring; the co-located steps are timed in full precision only).
    The other ``options`` and their defaults are :func:`profile_builtin_sizes`'.
    """
    return profile_builtin_sizes(name, batch_sizes=(batch_size,), **options)[0]


def profile_builtin_sizes(
    name: str,
    *,
    batch_sizes: Sequence[int],
    seq_len: int | None = None,
    device: str = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    optimizer: str = "adam",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    threads: int | None = None,
    colocated_ranks: int = 1,
    precision: str = "full",
) -> tuple[Profile, ...]:
    """:func:`profile_builtin` at each of ``batch_sizes`` samples per micro-batch, one
    profile each, the blocks' timed runs of all sizes interleaved
    (:func:`profile_model_sizes`); then the co-located steps, the sizes interleaved too
    (:func:`~pipeweave.profiler.colocated.colocated_slowdowns`)."""
    from ..data import SEQUENCE_DATASETS, build_dataset
    from ..models import build_model, default_seq_len
    from .colocated import colocated_slowdowns, sharing_overhead

    if colocated_ranks > 1 and device != "cpu":
        raise ValueError(f"colocated_ranks={colocated_ranks} models ranks sharing CPU cores; on "
                         f"{device} every rank has its own device: leave it at 1")
    if colocated_ranks > 1 and precision != "full":
        raise ValueError(f"colocated_ranks={colocated_ranks} times whole steps in full precision "
                         f"only, not --precision {precision}; profile with --colocated-ranks 1, "
                         f"or with --precision full")
    spec = build_model(name, seed=seed, **(overrides or {}))
    dataset = spec.dataset or "digits"
    if dataset in SEQUENCE_DATASETS and seq_len is None:
        seq_len = default_seq_len(name, **(overrides or {}))
    batches = [next(iter(build_dataset(dataset, batch_size=size, seq_len=seq_len, seed=seed)))
               for size in batch_sizes]
    profiles = profile_model_sizes(spec, batches, device=device, warmup=warmup,
                                   repeats=repeats, optimizer=optimizer, threads=threads,
                                   precision=precision)
    if colocated_ranks == 1:
        return profiles
    slowdowns = colocated_slowdowns(spec, batches, ranks=colocated_ranks, batch_sizes=batch_sizes,
                                    seq_len=seq_len, overrides=overrides,
                                    threads=threads or torch.get_num_threads(), seed=seed)
    return tuple(replace(profile, metadata={
        **profile.metadata, "colocated_ranks": colocated_ranks, "colocated_slowdown": slowdown,
        "sharing_overhead": sharing_overhead(slowdown, colocated_ranks,
                                             profile.metadata["cores"])})
        for profile, slowdown in zip(profiles, slowdowns))
