"""What a rank holds in memory, counted (not sampled): model state and activations.

AvgPipe's memory limit (avgpipe.txt §4.2, Algorithm 1's ``is_mem_available``; §5.2's
``F_mod + F_dat``) is per device. pipeweave counts the two parts the same way on every
device, so that a run's numbers are deterministic and the CPU and GPU agree:

* **state** (:func:`state_bytes`, :func:`estimate_state_bytes`): per parallel pipeline,
  parameters + gradients + optimizer state of the stages a rank hosts, times ``N``, plus the
  reference model's parameters when the schedule averages (one copy, §3.2). Before a run,
  :func:`estimate_state_bytes` asks the memory model (:mod:`pipeweave.memory`, the one
  ``plan``, ``auto`` and ``tune`` ask) with the parameters counted from the blocks' shapes;
  :func:`state_bytes` counts what a built rank holds;
* **activations** (:class:`ActivationMeter`): the bytes a rank keeps between a forward and
  its backward, i.e. the tensors autograd saves (seen through
  ``torch.autograd.graph.saved_tensors_hooks``), the stage's input and its output, each
  storage view counted once and parameters and buffers never. The meter keeps the running
  sum over all stages and pipelines of the rank and its peak.

RSS (the CPU's peak resident memory) never goes down and counts the allocator's slack, so it
cannot tell one advance from the next; ``torch.cuda.max_memory_allocated`` could, but only on
GPUs. Transient tensors (inside one forward or backward) are not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ...memory import StageWeights, model_state, optimizer_key, stage_state
from ...planner.memory import plan_analysis, plan_sharding
from ...planner.plan import Plan
from ...saved_tensors import observing_saved
from ..communication.sharded import local_value, stored_part

if TYPE_CHECKING:
    from ...models import ModelSpec
    from ..execution.parts import RankParts

__all__ = ["ActivationMeter", "state_bytes", "estimate_state_bytes", "stage_weights_of",
           "model_optimizer", "check_memory_limit"]

_Key = tuple[int, int, int, int]
"""(stage, micro-batch, piece, pipeline)."""


def _is_parameter(tensor: Tensor) -> bool:
    """A parameter, or a view of one (``weight.t()``), saved by a forward: not an activation."""
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


def _nbytes(tensor: Tensor) -> int:
    """Bytes this rank stores (its shard of a sharded tensor)."""
    local = local_value(tensor)
    return local.numel() * local.element_size()


class ActivationMeter:
    """Running and peak activation bytes of one rank (module docstring).

    Use :meth:`forward` around a stage's forward and :meth:`release` after its backward;
    :meth:`start_window` resets :attr:`window_peak` (e.g. once per iteration).
    """

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self.window_peak = 0
        self._by_key: dict[_Key, int] = {}
        self._excluded: dict[int, frozenset[int]] = {}

    def start_window(self) -> None:
        self.window_peak = self.held

    @contextmanager
    def forward(self, key: _Key, module: nn.Module, inputs: Tensor) -> Iterator[list[Tensor]]:
        """Count what the forward inside saves; append its output to the yielded list."""
        excluded = self._excluded_storages(module)
        seen: set[tuple[int, int, int]] = set()
        total = 0

        def count(tensor: Tensor) -> None:
            nonlocal total
            if _is_parameter(tensor):  # e.g. FSDP2's gathered parameters (new storage each time)
                return
            tensor = stored_part(tensor)  # a DTensor activation (tensor parallelism): its part
            storage = tensor.untyped_storage().data_ptr()
            if storage in excluded:
                return
            view = (storage, tensor.data_ptr(), _nbytes(tensor))
            if view not in seen:
                seen.add(view)
                total += view[2]

        outputs: list[Tensor] = []
        count(inputs)
        with observing_saved(count):
            yield outputs
        for output in outputs:
            count(output)
        self._by_key[key] = self._by_key.get(key, 0) + total
        self.held += total
        self.peak = max(self.peak, self.held)
        self.window_peak = max(self.window_peak, self.held)

    def release(self, stage: int, microbatch: int, pipeline: int) -> None:
        """The backward of ``microbatch`` freed what its forward (every piece) kept."""
        for piece in (0, 1, 2):
            self.held -= self._by_key.pop((stage, microbatch, piece, pipeline), 0)

    def _excluded_storages(self, module: nn.Module) -> frozenset[int]:
        # Parameters are updated in place, so their storages stay put for the whole run.
        if id(module) not in self._excluded:
            tensors = [local_value(t) for t in (*module.parameters(), *module.buffers())]
            self._excluded[id(module)] = frozenset(t.untyped_storage().data_ptr() for t in tensors)
        return self._excluded[id(module)]


def _module_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters + gradients (one per parameter, alive from the first backward to the step)
    + the optimizer's state tensors."""
    params = sum(_nbytes(p) for p in module.parameters())
    grads = sum(_nbytes(p) for p in module.parameters() if p.requires_grad)
    state = sum(_nbytes(v) for s in optimizer.state.values() for v in s.values()
                if isinstance(v, Tensor))
    return params + grads + state


def state_bytes(parts: RankParts) -> int:
    """Model state a built rank holds now (module docstring); the optimizer state is complete
    once every stage has stepped (after the first iteration)."""
    total = 0
    for pipeline in parts.pipelines:
        for stage, module in ((s, r.module) for s, r in pipeline.stages.items()):
            total += _module_state_bytes(module, pipeline.optimizers[stage])
    for averager in parts.averagers.values():
        total += sum(_nbytes(t) for t in averager.reference_parameters().values())
    return total


def estimate_state_bytes(spec: ModelSpec, plan: Plan,
                         optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
                         *, averaging: bool = True) -> list[int]:
    """Per rank of ``plan``, before anything runs: the memory model's state
    (:func:`pipeweave.planner.memory.predicted_state`'s parts: parameters, gradients,
    optimizer state, weight copies, times ``N`` pipelines, plus the reference model when the
    schedule averages), with the parameters counted from the blocks' shapes (nothing is
    copied, allocated or stepped). ``averaging`` False: leave the reference model out.
    """
    weights = [stage_weights_of(spec.blocks[start:end]) for start, end in plan.stages]
    analysis = plan_analysis(plan)
    layout = analysis.schedule.layout
    states = model_state(weights, stage_state(weights, model_optimizer(optimizer)),
                         [layout.stages_of(r) for r in range(layout.num_ranks)],
                         pipelines=analysis.schedule.pipelines,
                         reference=averaging and analysis.averages,
                         copies=analysis.copies(plan.semantics.backward == "graph"),
                         sharding=plan_sharding(plan))
    return [int(s.total) for s in states]


def stage_weights_of(blocks: Sequence[nn.Module]) -> StageWeights:
    """What a stage of ``blocks`` holds, from the parameters' shapes (a parameter the blocks
    share once; meta tensors are fine): bytes, trainable bytes and trainable tensors."""
    params = list(nn.Sequential(*blocks).parameters())
    trainable = [p for p in params if p.requires_grad]
    return StageWeights(parameters=float(sum(_nbytes(p) for p in params)),
                        trainable=float(sum(_nbytes(p) for p in trainable)),
                        tensors=len(trainable),
                        largest_block=float(max((sum(_nbytes(p) for p in b.parameters())
                                                 for b in blocks), default=0)))


def model_optimizer(optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]) -> str:
    """The memory model's name (:data:`pipeweave.memory.OPTIMIZER_STATE`) for what
    ``optimizer`` builds: read off its name and keyword arguments when it has them
    (``OptimizerFactory``), else off an optimizer it builds over one stand-in scalar."""
    name, kwargs = getattr(optimizer, "name", None), getattr(optimizer, "kwargs", None)
    if isinstance(name, str) and isinstance(kwargs, dict):
        return optimizer_key(name, kwargs)
    probe = optimizer([nn.Parameter(torch.zeros(()))])
    return optimizer_key(type(probe).__name__.lower(), probe.defaults)


def check_memory_limit(limit: float, state: Sequence[int], plan: Plan) -> None:
    """Reject a memory limit that the model state alone exceeds on some rank, naming the fix."""
    worst = max(range(len(state)), key=lambda r: state[r])
    if state[worst] < limit:
        return
    n = plan.pipelines
    raise ValueError(
        f"--memory-limit {limit:.0f} B is below what rank {worst} needs before any activation: "
        f"{state[worst]:.0f} B of parameters, gradients and optimizer state for N={n} parallel "
        f"pipeline{'s' if n > 1 else ''} plus the reference model; give --memory-limit above "
        f"{state[worst]:.0f} B (e.g. {_suggest(state[worst])}), or use fewer --pipelines or "
        f"more --stages")


def _suggest(needed: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if needed >= size:
            return f"{needed * 2 / size:.3g}{unit}"
    return f"{needed * 2:.0f}"
