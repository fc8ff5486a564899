"""Weight prediction: PipeOptim's optimizer-dependent update direction, and SpecTrain's.

PipeOptim (pipeoptim.txt §III, Eq. 5) predicts the weights ``s`` updates ahead as
``Ŵ = W_t - lr * s * ΔW_t``. We define ``ΔW_t`` for every optimizer the same way: **the
direction the optimizer's last real step took**, ``ΔW_t = (W_{t-1} - W_t) / lr_t`` (``lr_t``
the learning rate of that step). That is Table I's rule wherever Table I has one, and it
extends to every flag of torch's optimizers and to every other optimizer:

=====================  ===================================================  =================
optimizer               ΔW_t (torch's own update rule, ``g`` the gradient)    computed from
=====================  ===================================================  =================
SGD, momentum 0         ``g' = ±g + λ W_{t-1}`` (Table I with ``u = 0``)      ``g'`` kept at the
                                                                              step
SGD, momentum ``u``     ``v_t = u v_{t-1} + (1-τ) g'`` (Table I)              optimizer state
SGD, Nesterov           ``g' + u v_t``                                        ``g'`` + state
Adam (L2 decay)         ``m̂_t / (sqrt(v̂_t) + ε)`` (AMSGrad: max of ``v``)     optimizer state
AdamW / decoupled       ``m̂_t / (sqrt(v̂_t) + ε) + λ W_{t-1}``                 state + ``W_t``
anything else           ``(W_{t-1} - W_t) / lr_t``                            ``W_{t-1}`` kept
=====================  ===================================================  =================

``±g``: ``-g`` with ``maximize=True``; ``λ``: the group's ``weight_decay``; ``τ``: dampening.
AdamW's ``W_{t-1}`` is recovered from ``W_t = (1 - lr λ) W_{t-1} - lr m̂/(sqrt(v̂)+ε)``
without a copy. Every row is checked against the difference of two consecutive weight
versions of torch's real step (tests/runtime/test_prediction.py).

``lr`` in ``Ŵ`` is read from the parameter's group at prediction time, so learning-rate
schedulers apply. Before the first update there is no step to follow: ``ΔW = 0`` and the
prediction is the identity (the paper's Algorithm 1 starts from ``W_1`` the same way).

**SpecTrain** (Chen et al. 2018; pipeoptim.txt §II-C) predicts with the smoothed gradient
alone, ``Ŵ = W - lr * s * v_t`` (the SGD momentum buffer, also under Nesterov), and refuses
other optimizers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

__all__ = ["DirectionTracker", "check_spectrain_optimizer", "RULES", "keeps_state"]

RULES = ("optimizer", "momentum")
"""``optimizer``: PipeOptim's ΔW (the last step's direction); ``momentum``: SpecTrain's ``v_t``."""


def _scalar(value: float | Tensor) -> float:
    return float(value.item()) if isinstance(value, Tensor) else float(value)


class DirectionTracker:
    """ΔW of every parameter of one stage (module docstring), kept up to date across steps.

    The owner calls :meth:`before_step` right before ``optimizer.step()`` (gradients still
    in ``.grad``) and :meth:`after_step` right after; :meth:`predict` then gives ``Ŵ``.
    Only what the optimizer's rule needs is kept: nothing for SGD with plain momentum or for
    Adam, the effective gradient for SGD without momentum or with Nesterov, the previous
    weights for any other optimizer (one preallocated buffer per parameter).
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 params: Iterable[tuple[str, nn.Parameter]], *, rule: str = "optimizer") -> None:
        if rule not in RULES:
            raise ValueError(f"prediction rule {rule!r}; choose one of {RULES}")
        if rule == "momentum":
            check_spectrain_optimizer(optimizer)
        self.optimizer = optimizer
        self.rule = rule
        self.params = dict(params)
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self.params.items() if id(p) not in groups]
        if missing:
            raise ValueError(f"parameters {missing} are not managed by the stage's optimizer")
        self._group = {n: groups[id(p)] for n, p in self.params.items()}
        self._kind = _kind(optimizer)
        self._kept: dict[str, Tensor] = {}  # g' (SGD) or W_{t-1} (generic), per parameter
        self._step_lr: dict[str, float] = {}
        self.steps = 0

    # -- around the optimizer's step ---------------------------------------------------------
    def before_step(self) -> None:
        with torch.no_grad():
            for name, param in self.params.items():
                group = self._group[name]
                self._step_lr[name] = _scalar(group["lr"])
                if self.rule == "momentum":
                    continue
                if self._kind == "sgd" and (group["momentum"] == 0 or group["nesterov"]):
                    if param.grad is None:
                        self._kept.pop(name, None)
                        continue
                    self._keep_effective_gradient(name, param, group)
                elif self._kind == "generic":
                    buffer = self._kept.get(name)
                    if buffer is None:
                        self._kept[name] = param.detach().clone()
                    else:
                        buffer.copy_(param)

    def _keep_effective_gradient(self, name: str, param: nn.Parameter, group: Mapping) -> None:
        """``g' = ±g + λW`` into this parameter's buffer (allocated at the first step only)."""
        assert param.grad is not None
        buffer = self._kept.get(name)
        if buffer is None or buffer.shape != param.shape:
            buffer = self._kept[name] = torch.empty_like(param)
        decay = group["weight_decay"]
        if group["maximize"]:
            torch.neg(param.grad, out=buffer)
        else:
            buffer.copy_(param.grad)
        if decay:
            buffer.add_(param, alpha=decay)

    def after_step(self) -> None:
        self.steps += 1

    def resume(self, steps: int) -> None:
        """Continue after ``steps`` updates restored from a checkpoint (optimizer state loaded):
        the direction then comes from the optimizer state alone, which holds for the optimizers
        :func:`keeps_state` is False for (the others are refused with checkpoints)."""
        assert not keeps_state(self.optimizer, self.rule), "refused by check_checkpointable"
        self.steps = steps
        self._step_lr = {name: _scalar(group["lr"]) for name, group in self._group.items()}

    # -- the direction and the prediction ----------------------------------------------------
    def direction(self, name: str) -> Tensor | None:
        """``ΔW`` of parameter ``name`` (None before the first step, or without a gradient)."""
        if self.steps == 0:
            return None
        param = self.params[name]
        group = self._group[name]
        state = self.optimizer.state.get(param) or {}
        if self.rule == "momentum":
            return state.get("momentum_buffer")
        if self._kind == "sgd":
            return _sgd(group, state, self._kept.get(name))
        if self._kind == "adam":
            return _adam(group, state, param.detach(), self._step_lr[name]) if state else None
        previous = self._kept.get(name)
        lr = self._step_lr.get(name, 0.0)
        if previous is None or lr == 0.0:
            return None
        return (previous - param.detach()) / lr

    def predict(self, steps: int) -> dict[str, Tensor]:
        """``{name: W - lr * steps * ΔW}`` as new tensors (a copy of ``W`` where ΔW is unknown)."""
        predicted = {name: torch.empty_like(param) for name, param in self.params.items()}
        self.predict_into(steps, predicted)
        return predicted

    def predict_into(self, steps: int, out: Mapping[str, Tensor]) -> None:
        """Write ``W - lr * steps * ΔW`` into ``out[name]`` in place, one pass per tensor."""
        with torch.no_grad():
            for name, param in self.params.items():
                target = out[name]
                direction = self.direction(name) if steps else None
                if direction is None:
                    target.copy_(param)
                else:
                    lr = _scalar(self._group[name]["lr"])
                    torch.add(param.detach(), direction, alpha=-lr * steps, out=target)


def keeps_state(optimizer: torch.optim.Optimizer, rule: str = "optimizer") -> bool:
    """Whether the direction needs more than the optimizer's state: the last effective
    gradient (SGD without momentum, Nesterov) or the previous weights (any optimizer but
    SGD, Adam, AdamW). SpecTrain's rule reads the momentum buffer alone."""
    if rule == "momentum":
        return False
    kind = _kind(optimizer)
    if kind == "sgd":
        return any(g["momentum"] == 0 or g["nesterov"] for g in optimizer.param_groups)
    return kind == "generic"


def _kind(optimizer: torch.optim.Optimizer) -> str:
    if type(optimizer) is torch.optim.SGD:
        return "sgd"
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        return "adam"
    return "generic"


def _sgd(group: Mapping, state: Mapping, effective_grad: Tensor | None) -> Tensor | None:
    momentum = group["momentum"]
    if momentum == 0:
        return effective_grad
    buffer = state.get("momentum_buffer")
    if buffer is None:
        return None
    if group["nesterov"]:
        return None if effective_grad is None else effective_grad + momentum * buffer
    return buffer


def _adam(group: Mapping, state: Mapping, param: Tensor, step_lr: float) -> Tensor:
    beta1, beta2 = (_scalar(b) for b in group["betas"])
    step = _scalar(state["step"])
    second = state["max_exp_avg_sq"] if group["amsgrad"] else state["exp_avg_sq"]
    denominator = (second / (1 - beta2**step)).sqrt_().add_(group["eps"])
    direction = (state["exp_avg"] / (1 - beta1**step)).div_(denominator)
    decay = group["weight_decay"]
    if decay and group.get("decoupled_weight_decay", False):
        # W_t = (1 - lr λ) W_{t-1} - lr a  =>  W_{t-1} = (W_t + lr a) / (1 - lr λ)
        previous = (param + step_lr * direction) / (1 - step_lr * decay)
        direction = direction + decay * previous
    return direction


def check_spectrain_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """SpecTrain's prediction is defined for SGD with momentum only."""
    if type(optimizer) is not torch.optim.SGD or any(g["momentum"] == 0 for g in optimizer.param_groups):
        raise ValueError(
            f"SpecTrain predicts with the SGD momentum buffer and needs torch.optim.SGD with "
            f"momentum > 0; got {type(optimizer).__name__}. Use --optimizer sgd --momentum 0.9, "
            f"or the pipeoptim schedule, which supports Adam/AdamW/any optimizer"
        )
