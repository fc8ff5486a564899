"""Sequential oracles: each asynchronous method's update rule, applied literally, in one loop.

No schedules, no stages in flight, no messages: micro-batches are processed one after another
and every stage's forward/backward weights are *looked up by the paper's formula* in a history
of versions. The runtime's results must equal these per parameter.

With ``P`` stages (0-based ``s``), ``M`` micro-batches per iteration, micro-batch ``j``
(global), batch/period ``b = j // M``:

==================  ========================================  =============================
method              forward weights of stage s for j          update
==================  ========================================  =============================
pipedream           W_s(t), t = max(0, j - (P - s) + 1)        every micro-batch:
                    (pipedream.txt §3.3: the update at stage   W_s(j+1) = step(W_s(j), g_s(j))
                    k uses weights n - k updates old)
pipedream + vs      W_s(t0), t0 = stage 0's t for j            every micro-batch
2bw                 W_s(max(0, b - 1)) (one delay term)        every batch:
                                                               W(b+1) = step(W(b), Σ_b g)
pipeoptim           Ŵ = W_s(t) - lr·k·ΔW_t, k = j - t           every micro-batch; the
                    (Eq. 5; ΔW_t = (W_s(t-1) - W_s(t)) / lr,    gradient is taken at W_s(j)
                    the step torch really took); backward at
                    the current W_s(j) (Algorithm 1)
spectrain           Ŵ = W_s(t) - lr·(k + ⌊s/2⌋)·v_t;            every micro-batch
                    backward at W_s(j) - lr·⌊s/2⌋·v_j
                    (v_t: torch's momentum buffer after step t)
wpipe (2P stages)   G1 (s ≥ P): W(b); G0 (s < P): W(max(0,b-1)) every period, each group:
                    — Eq. 1 lists each group's own weights;   W(b+1) = step(W(b), Σ_b g)
                    one micro-batch is evaluated at the mixed
                    point (G0 at b-1, G1 at b)
==================  ========================================  =============================

**Drain** (``drain=N``, the schedules' option of that name): every ``N`` iterations the
pipeline empties and starts afresh, so a version is never older than the drain before it: with
``b0 = N·floor(b/N)`` and ``j0 = b0·M`` the first iteration and micro-batch of ``j``'s segment,
every ``max(0, ·)`` above becomes ``max(b0, ·)`` (2bw, wpipe's G0) or ``max(j0, ·)`` (the
per-micro-batch methods), and PipeOptim's ``k = j - t`` shrinks with ``t``.

**Corrections** (the options of docs/semantics.md, "Stale-weight corrections"): ``warmup=W``
makes each of the first ``W`` iterations its own segment, cut into single updates (one batch
for 2bw/wpipe, one micro-batch for the others), so ``max(b0, ·)``/``max(j0, ·)`` above give
the newest weights; ``nesterov=G`` steps every stage's SGD as Nesterov with momentum
``u + τ_s (G - u) / (τ_max + 1)``; ``pipemare=K`` multiplies the learning rate of update ``v``
(1-based) by ``τ_s ** -(1 - min(v / K, 1))`` where ``τ_s > 1``. ``τ_s`` is the method's
steady-state delay: ``P - s - 1`` (pipedream, pipeoptim), ``P - 1`` (vertical sync), 1 (2bw,
wpipe's G0), 0 (wpipe's G1).

Backwards are taken stage by stage: the stage's forward is recomputed from its saved input on
its backward weights and differentiated against the gradient coming from the next stage
(for the stashing methods the backward weights are the forward weights, so this is the same
computation as one graph).

Samples per update: the per-micro-batch methods (pipedream, pipeoptim, spectrain) step on the
gradient of the mean loss over one micro-batch; 2bw and wpipe on the mean over the batch.

Nothing here uses the runtime: ΔW comes from two consecutive versions in the history, SpecTrain's
``v_t`` from torch's own optimizer state, so a wrong rule in ``runtime/execution/prediction.py`` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .models import ModelSpec
from .models.naming import global_names

__all__ = ["OracleResult", "run_oracle", "run_elastic_oracle", "METHODS"]

@dataclass(frozen=True)
class OracleResult:
    losses: list[float]
    """Mean loss per iteration."""
    parameters: dict[str, Tensor]
    """``"<block>.<name>"`` -> final value."""


@dataclass
class _Version:
    params: dict[str, Tensor]
    momentum: dict[str, Tensor]
    """torch's SGD momentum buffer per parameter after the step that made this version."""
    lr: float
    """Learning rate of that step."""


class _Stage:
    """One stage's live weights, optimizer and history of versions."""

    def __init__(self, module: nn.Module, make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]) -> None:
        self.module = module
        self.optimizer = make_optimizer(module.parameters())
        self.names = [n for n, _ in module.named_parameters()]
        self.history: list[_Version] = []
        self.pending: dict[str, Tensor] = {}
        self._record()

    def _record(self) -> None:
        named = dict(self.module.named_parameters())
        momentum = {n: self.optimizer.state[p]["momentum_buffer"].clone()
                    for n, p in named.items()
                    if self.optimizer.state.get(p, {}).get("momentum_buffer") is not None}
        self.history.append(_Version({n: p.detach().clone() for n, p in named.items()},
                                     momentum, float(self.optimizer.param_groups[0]["lr"])))

    def weights(self, version: int) -> dict[str, Tensor]:
        return self.history[version].params

    def predicted(self, version: int, steps: int, rule: str = "optimizer") -> dict[str, Tensor]:
        """``W(version) - lr·steps·ΔW`` (Eq. 5). ``rule="optimizer"``: ΔW is the step that
        made ``version``, read off two consecutive versions; ``"momentum"``: SpecTrain's
        momentum buffer. Version 0 (no step yet) predicts itself."""
        record = self.history[version]
        if version == 0 or steps == 0:
            return record.params
        if rule == "momentum":
            directions = record.momentum
        else:
            before = self.history[version - 1].params
            directions = {n: (before[n] - w) / record.lr for n, w in record.params.items()}
        lr = float(self.optimizer.param_groups[0]["lr"])
        return {n: w - lr * steps * directions[n] if n in directions else w
                for n, w in record.params.items()}

    def accumulate(self, grads: Mapping[str, Tensor]) -> None:
        for name, grad in grads.items():
            self.pending[name] = grad.clone() if name not in self.pending else self.pending[name] + grad

    def step(self, momentum: float | None = None, lr_factor: float = 1.0) -> None:
        """The optimizer's step on the pending gradients; ``momentum``: as a Nesterov step
        with that coefficient (the ``nesterov`` correction), ``lr_factor``: times the
        learning rate (PipeMare's T1), both for this step only."""
        for name, param in self.module.named_parameters():
            param.grad = self.pending.get(name)
        group = self.optimizer.param_groups[0]
        saved = dict(group)
        if momentum is not None and "betas" in group:  # NAdam: beta1 is its momentum
            group["betas"] = (momentum, group["betas"][1])
        elif momentum is not None:
            group.update(momentum=momentum, nesterov=True)
        group["lr"] = saved["lr"] * lr_factor
        self.optimizer.step()
        group.update({k: saved[k] for k in ("lr", "momentum", "nesterov", "betas") if k in saved})
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = {}
        self._record()


Weights = dict[str, Tensor]
WeightRule = Callable[[_Stage, int, int, int, int, int | None, int, int],
                      tuple[Weights, Weights]]
"""``(stage state, s, P, j, b, lookahead, b0, j0) -> (forward weights, backward weights)``;
``b0``, ``j0``: the first iteration and micro-batch of the drained segment ``j`` is in (no
weights older than the last drain; 0 without drains)."""


@dataclass(frozen=True)
class _Rule:
    """One method of the module docstring's table."""

    weights: WeightRule
    per_batch: bool = False
    """Updates once per batch on the batch's mean (2bw, wpipe), not after every micro-batch."""
    groups: int = 1
    """Stages per rank (WPipe's G0 and G1): the depth P is the stage count over this."""
    graph_backward: bool = False
    """``backward="graph"`` applies: the backward differentiates at the forward's weights."""
    delay: Callable[[int, int], int] = lambda s, depth: depth - s - 1
    """``τ_s`` of stage ``s`` of ``depth``: updates between a gradient's weights and its
    update, in steady state (PipeDream's ``P - s - 1``), for ``nesterov`` and ``pipemare``."""


def _wpipe(stage: _Stage, s: int, depth: int, j: int, b: int,
           lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    v = b if s >= depth else max(b0, b - 1)
    return stage.weights(v), stage.weights(v)


def _two_bw(stage: _Stage, s: int, depth: int, j: int, b: int,
            lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    v = max(b0, b - 1)
    return stage.weights(v), stage.weights(v)


def _pipedream(stage: _Stage, s: int, depth: int, j: int, b: int,
               lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    t = max(j0, j - (depth - s) + 1)
    return stage.weights(t), stage.weights(t)


def _vertical_sync(stage: _Stage, s: int, depth: int, j: int, b: int,
                   lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    t0 = max(j0, j - depth + 1)
    return stage.weights(t0), stage.weights(t0)


def _pipeoptim(stage: _Stage, s: int, depth: int, j: int, b: int,
               lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    t = max(j0, j - (depth - s) + 1)
    k = j - t if lookahead is None or s == depth - 1 else lookahead
    return (stage.predicted(t, k) if k else stage.weights(t)), stage.weights(j)


def _spectrain(stage: _Stage, s: int, depth: int, j: int, b: int,
               lookahead: int | None, b0: int = 0, j0: int = 0) -> tuple[Weights, Weights]:
    t = max(j0, j - (depth - s) + 1)
    back = s // 2
    forward = stage.predicted(t, (j - t) + back, "momentum")
    return forward, stage.predicted(j, back, "momentum") if back else stage.weights(j)


_RULES: dict[str, _Rule] = {
    "pipedream": _Rule(_pipedream),
    "pipedream-vs": _Rule(_vertical_sync, delay=lambda s, depth: depth - 1),
    "2bw": _Rule(_two_bw, per_batch=True, delay=lambda s, depth: 1),
    "pipeoptim": _Rule(_pipeoptim, graph_backward=True),
    "spectrain": _Rule(_spectrain),
    "wpipe": _Rule(_wpipe, per_batch=True, groups=2, delay=lambda s, depth: int(s < depth)),
}

METHODS = tuple(_RULES)
"""The methods the oracle knows (the asynchronous schedules' names, and ``pipedream-vs``)."""


def run_oracle(method: str, *, spec: ModelSpec, stages: list[tuple[int, int]], microbatches: int,
               steps: int, data: Iterable[tuple[Tensor, Tensor]],
               optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
               lookahead: int | None = None, backward: str = "recompute",
               drain: int | None = None, warmup: int = 0, nesterov: float | None = None,
               pipemare: int | None = None) -> OracleResult:
    """Train ``spec`` split at ``stages`` with ``method``'s rule (see module docstring).

    ``drain``: empty the pipeline after every ``drain`` iterations (module docstring).
    ``warmup``, ``nesterov``, ``pipemare``: the stale-weight corrections of the options of
    those names (module docstring, "Corrections").

    ``backward="graph"`` (PipeOptim only) differentiates at the predicted forward weights
    instead of the current ones, as the runtime's option of the same name does.
    """
    if method not in _RULES:
        raise ValueError(f"unknown method {method!r}; the oracle knows {METHODS}")
    rule = _RULES[method]
    depth = len(stages) // rule.groups
    modules = [nn.Sequential(*spec.stage_blocks(a, b, "cpu")).train() for a, b in stages]
    state = [_Stage(m, optimizer) for m in modules]
    iterator = iter(data)
    losses: list[float] = []
    total_stages = len(stages)
    for b in range(steps):
        inputs, targets = next(iterator)
        rows = inputs.shape[0] // microbatches
        loss_sum = 0.0
        for i in range(microbatches):
            j = b * microbatches + i
            x = inputs[i * rows:(i + 1) * rows]
            y = targets[i * rows:(i + 1) * rows]
            b0, j0 = _segment_start(b, j, microbatches, rule.per_batch, warmup, drain)
            forward_w, backward_w = map(list, zip(*(
                rule.weights(state[s], s, depth, j, b, lookahead, b0, j0)
                for s in range(total_stages))))
            if backward == "graph" and rule.graph_backward:
                backward_w = forward_w
            mean = _forward_backward(modules, state, forward_w, backward_w, x, y, spec.loss_fn,
                                     scale=rows / inputs.shape[0] if rule.per_batch else 1.0)
            loss_sum += mean * rows / inputs.shape[0]
            if not rule.per_batch or (j + 1) % microbatches == 0:
                _step_all(state, rule, depth, nesterov, pipemare)
        losses.append(loss_sum)
    parameters: dict[str, Tensor] = {}
    for (start, _), module in zip(stages, modules):
        for name, param in global_names(module.named_parameters(), start):
            parameters[name] = param.detach().clone()
    return OracleResult(losses, parameters)


def _segment_start(b: int, j: int, microbatches: int, per_batch: bool, warmup: int,
                   drain: int | None) -> tuple[int, int]:
    """``(b0, j0)``: the first iteration and micro-batch of the segment ``j`` is in: a
    warm-up iteration's own update (one batch, or ``j`` itself), else the drained segment
    (never before the warm-up's end)."""
    if b < warmup:
        return b, b * microbatches if per_batch else j
    first = max(warmup, b - b % drain) if drain else warmup
    return first, first * microbatches


def _step_all(state: list[_Stage], rule: _Rule, depth: int, nesterov: float | None,
              pipemare: int | None) -> None:
    """Every stage's update, corrected: Nesterov with ``u + τ (G - u) / (τ_max + 1)``
    (``nesterov=G``), the step size times ``τ ** -(1 - min(v / K, 1))`` (``pipemare=K``,
    ``v`` the update's 1-based number, ``τ > 1`` only)."""
    delays = [rule.delay(s, depth) for s in range(len(state))]
    for stage, tau in zip(state, delays):
        momentum = None
        if nesterov is not None:
            group = stage.optimizer.param_groups[0]
            base = float(group["betas"][0] if "betas" in group else group["momentum"])
            momentum = base + tau * (nesterov - base) / (max(delays) + 1)
        factor = 1.0
        if pipemare is not None and tau > 1:
            factor = tau ** -(1.0 - min(len(stage.history) / pipemare, 1.0))
        stage.step(momentum, factor)


def run_elastic_oracle(*, spec: ModelSpec, pipelines: int, steps: int,
                       data: Iterable[tuple[Tensor, Tensor]],
                       optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
                       alpha: float | None = None, order: str = "simultaneous") -> OracleResult:
    """AvgPipe's elastic averaging, sequentially (avgpipe.txt §3.2).

    Every iteration k, parallel model p trains on batch ``k*N + p`` (full batch, mean loss),
    takes its optimizer step ``δ``, and is pulled to the previous reference:
    ``w <- w + δ - α (w - w_ref)`` ("simultaneous") or ``w <- (w+δ) - α ((w+δ) - w_ref)``;
    then the reference takes the normalised accumulated update, ``w_ref <- w_ref + mean_p δ_p``
    (for "simultaneous" that is ``mean_p w_p``, computed that way). Returns the reference
    model and the mean loss over the parallel models per iteration.
    """
    alpha = 1.0 / pipelines if alpha is None else alpha
    models = [nn.Sequential(*spec.stage_blocks(0, len(spec.blocks), "cpu")).train()
              for _ in range(pipelines)]
    optimizers = [optimizer(m.parameters()) for m in models]
    reference = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    iterator = iter(data)
    losses = []
    for _ in range(steps):
        total = {n: torch.zeros_like(t) for n, t in reference.items()}
        updates = {n: torch.zeros_like(t) for n, t in reference.items()}
        loss_sum = 0.0
        for model, opt in zip(models, optimizers):
            inputs, targets = next(iterator)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            loss = spec.loss_fn(model(inputs), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach())
            with torch.no_grad():
                for name, param in model.named_parameters():
                    updates[name] = updates[name] + (param.detach() - before[name])
                    anchor = before[name] if order == "simultaneous" else param.detach()
                    param.sub_(alpha * (anchor - reference[name]))
                    total[name] = total[name] + param.detach()
        if order == "simultaneous":
            reference = {n: s / pipelines for n, s in total.items()}
        else:
            reference = {n: reference[n] + u / pipelines for n, u in updates.items()}
        losses.append(loss_sum / pipelines)
    return OracleResult(losses, dict(reference))


def _forward_backward(modules: Sequence[nn.Module], state: list["_Stage"], forward_w: list[Weights],
                      backward_w: list[Weights], x: Tensor, y: Tensor, loss_fn: Any, *,
                      scale: float) -> float:
    """One micro-batch through every stage: the forward at ``forward_w`` (inputs kept), each
    backward at ``backward_w`` from the kept input, gradients into each stage's pending sum;
    the loss's gradient scaled by ``scale`` (one update sees the micro-batch: 1, or the
    batch: its share). Returns the micro-batch's mean loss."""
    saved = []
    with torch.no_grad():
        for s, module in enumerate(modules):
            saved.append(x)
            x = functional_call(module, forward_w[s], (x,))
    grad: Tensor | None = None
    mean_loss = 0.0
    for s in reversed(range(len(modules))):
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in backward_w[s].items()}
        x_in = saved[s].detach().requires_grad_(s > 0 and saved[s].is_floating_point())
        out = functional_call(modules[s], leaves, (x_in,))
        if s == len(modules) - 1:
            mean = loss_fn(out, y)
            mean_loss = float(mean.detach())
            (mean * scale if scale != 1.0 else mean).backward()
        else:
            torch.autograd.backward(out, grad)
        grad = x_in.grad
        state[s].accumulate({n: t.grad for n, t in leaves.items() if t.grad is not None})
    return mean_loss
