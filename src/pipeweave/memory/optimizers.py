"""Optimizer state per parameter, as ``torch.optim`` keeps it (torch 2.x, after the first step).

Per parameter tensor of ``b`` bytes, the optimizer keeps ``k`` tensors of its size and dtype,
and, for those that count steps per tensor, one ``float32`` scalar (``state["step"]``)::

    sgd                        0            (no state)
    sgd-momentum               1            momentum_buffer
    adagrad                    1 + step     sum
    rmsprop                    1 + step     square_avg
    rmsprop-momentum           2 + step     + momentum_buffer
    rmsprop-centered           2 + step     + grad_avg
    rmsprop-centered-momentum  3 + step     + both
    adam, adamw                2 + step     exp_avg, exp_avg_sq
    adam-amsgrad, adamw-amsgrad 3 + step    + max_exp_avg_sq
    nadam                      2 + 2 steps  exp_avg, exp_avg_sq (+ mu_product, a second scalar)

:func:`optimizer_key` names the row for a ``torch.optim`` name and its keyword arguments (what
``pipeweave train --optimizer`` builds); the planner and ``auto`` take the row's name.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["OPTIMIZER_STATE", "STEP_COUNTERS", "STEP_BYTES", "optimizer_key",
           "optimizer_state_bytes", "check_optimizer"]

OPTIMIZER_STATE: dict[str, int] = {
    "sgd": 0, "sgd-momentum": 1, "adagrad": 1, "rmsprop": 1, "rmsprop-momentum": 2,
    "rmsprop-centered": 2, "rmsprop-centered-momentum": 3, "adam": 2, "adamw": 2,
    "adam-amsgrad": 3, "adamw-amsgrad": 3, "nadam": 2,
}
"""State tensors of a parameter's size per parameter (module docstring)."""

STEP_COUNTERS = frozenset(name for name in OPTIMIZER_STATE if not name.startswith("sgd"))
"""The optimizers that keep a step counter per parameter tensor."""

STEP_BYTES = 4
"""A step counter: a ``float32`` scalar tensor."""


def check_optimizer(optimizer: str) -> None:
    """ValueError naming the choices unless the model knows ``optimizer``'s state size."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r} has no known state size; choose one of "
                         f"{', '.join(sorted(OPTIMIZER_STATE))}")


def optimizer_state_bytes(optimizer: str, parameter_bytes: float, tensors: int = 0) -> float:
    """State bytes of ``optimizer`` for ``tensors`` trainable parameter tensors holding
    ``parameter_bytes`` (``tensors`` 0: not known, the step counters left out)."""
    check_optimizer(optimizer)
    counters = 2 if optimizer == "nadam" else 1  # NAdam's mu_product beside its step
    steps = STEP_BYTES * tensors * counters if optimizer in STEP_COUNTERS else 0
    return OPTIMIZER_STATE[optimizer] * parameter_bytes + steps


def optimizer_key(name: str, kwargs: Mapping[str, object]) -> str:
    """The row of :data:`OPTIMIZER_STATE` for ``torch.optim`` optimizer ``name`` (lower case,
    e.g. ``"adam"``) built with ``kwargs``."""
    if name == "sgd":
        return "sgd-momentum" if kwargs.get("momentum") else "sgd"
    if name in ("adam", "adamw"):
        return f"{name}-amsgrad" if kwargs.get("amsgrad") else name
    if name == "rmsprop":
        parts = ["rmsprop"] + (["centered"] if kwargs.get("centered") else []) \
            + (["momentum"] if kwargs.get("momentum") else [])
        return "-".join(parts)
    if name in ("adagrad", "nadam"):
        return name
    raise ValueError(f"optimizer {name!r} has no known state size; use one of sgd, adam, "
                     f"adamw, rmsprop, adagrad, nadam")
