"""Weight prediction: PipeOptim's optimizer-dependent update direction, and SpecTrain's.

PipeOptim (pipeoptim.txt §III, Eq. 3/5) predicts the weights ``s`` updates ahead as
``Ŵ = W - lr * s * ΔW`` where ``ΔW`` is the direction the optimizer's own rule would move the
weights by (Table I), read from the optimizer's *real* state and hyper-parameters:

* SGD with momentum ``u`` and dampening ``τ`` (weight decay is folded into the gradient and so
  into the buffer, as torch does): ``ΔW = v_t`` (the momentum buffer); with Nesterov the last
  step's direction ``g_t + u v_t``; without momentum the last gradient ``g_t``.
* Adam: ``ΔW = m̂_t / (sqrt(v̂_t) + ε)`` with bias corrections at the optimizer's own step
  count ``t`` (AMSGrad: the running max of ``v``); L2 weight decay is inside the moments.
* AdamW (``decoupled_weight_decay``): the same plus the decoupled term ``λ W_t``.
* anything else: a *trial step* — a deep copy of the optimizer state takes one step with the
  last gradient on a copy of the weights, and ``ΔW = (W - W_trial) / lr``.

``lr`` is read from the parameter's group at prediction time, so learning-rate schedulers
apply. Before the first update there is no state: ``ΔW = 0`` and the prediction is the
identity (the paper's Algorithm 1 starts from ``W_1`` the same way).

SpecTrain (the baseline in pipeoptim.txt §II-C) predicts with the SGD-momentum buffer only,
``Ŵ = W - lr * s * v_t``, and refuses other optimizers.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

__all__ = ["update_direction", "predict", "check_spectrain_optimizer", "group_of",
           "constructor_options"]


def group_of(optimizer: torch.optim.Optimizer, param: Tensor) -> dict:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    raise ValueError("parameter is not managed by this optimizer")


def update_direction(optimizer: torch.optim.Optimizer, param: nn.Parameter,
                     last_grad: Tensor | None) -> Tensor | None:
    """``ΔW`` for ``param`` (see module docstring); ``None`` before the first update."""
    state = optimizer.state.get(param)
    if not state:
        return None
    group = group_of(optimizer, param)
    if isinstance(optimizer, torch.optim.Adam):  # Adam and AdamW (AdamW subclasses Adam)
        return _adam_direction(group, state, param)
    if type(optimizer) is torch.optim.SGD:
        return _sgd_direction(group, state, last_grad)
    return _trial_direction(optimizer, param, last_grad)


def _sgd_direction(group: Mapping, state: Mapping, last_grad: Tensor | None) -> Tensor | None:
    buffer = state.get("momentum_buffer")
    if group["momentum"] == 0 or buffer is None:
        return last_grad
    if group["nesterov"]:
        assert last_grad is not None
        return last_grad + group["momentum"] * buffer
    return buffer


def _adam_direction(group: Mapping, state: Mapping, param: Tensor) -> Tensor:
    beta1, beta2 = group["betas"]
    step = float(state["step"])
    second = state["max_exp_avg_sq"] if group["amsgrad"] else state["exp_avg_sq"]
    m_hat = state["exp_avg"] / (1 - beta1**step)
    v_hat = second / (1 - beta2**step)
    direction = m_hat / (v_hat.sqrt() + group["eps"])
    if group.get("decoupled_weight_decay", False) and group["weight_decay"]:
        direction = direction + group["weight_decay"] * param.detach()
    return direction


def _trial_direction(optimizer: torch.optim.Optimizer, param: nn.Parameter,
                     last_grad: Tensor | None) -> Tensor | None:
    if last_grad is None:
        return None
    group = group_of(optimizer, param)
    trial = nn.Parameter(param.detach().clone())
    trial.grad = last_grad.clone()
    probe = type(optimizer)([trial], **constructor_options(optimizer, group))
    probe.state[trial] = copy.deepcopy(optimizer.state[param])
    probe.step()
    return (param.detach() - trial.detach()) / group["lr"]


def constructor_options(optimizer: torch.optim.Optimizer, group: Mapping) -> dict:
    """The hyper-parameters of ``group`` that ``type(optimizer)``'s constructor accepts."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in group.items() if k != "params" and k in accepted}


def predict(optimizer: torch.optim.Optimizer, params: Iterable[tuple[str, nn.Parameter]],
            steps: int, last_grads: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{name: W - lr * steps * ΔW}`` as new tensors (``W`` itself where there is no state)."""
    predicted: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, param in params:
            direction = update_direction(optimizer, param, last_grads.get(name))
            if direction is None or steps == 0:
                predicted[name] = param.detach().clone()
            else:
                lr = group_of(optimizer, param)["lr"]
                predicted[name] = param.detach() - (lr * steps) * direction
    return predicted


def check_spectrain_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """SpecTrain's prediction is defined for SGD with momentum only."""
    if type(optimizer) is not torch.optim.SGD or any(g["momentum"] == 0 for g in optimizer.param_groups):
        raise ValueError(
            f"SpecTrain predicts with the SGD momentum buffer and needs torch.optim.SGD with "
            f"momentum > 0; got {type(optimizer).__name__}. Use --optimizer sgd --momentum 0.9, "
            f"or the pipeoptim schedule, which supports Adam/AdamW/any optimizer"
        )
