"""ΔW is the direction of the optimizer's last real step, for every optimizer and flag.

Each case takes real ``torch.optim`` steps and compares :class:`DirectionTracker` with what
the test reads off two consecutive weight versions, ``(W_{t-1} - W_t) / lr``: nothing of
pipeweave's is used to compute the expectation.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeweave.runtime.execution.prediction import DirectionTracker

SETTINGS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd-wd-maximize": (torch.optim.SGD, {"lr": 0.1, "weight_decay": 0.05, "maximize": True}),
    "sgd-momentum-dampening": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    "sgd-momentum-wd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05}),
    "sgd-nesterov-wd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                                          "weight_decay": 0.05}),
    "sgd-nesterov-maximize": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.8, "nesterov": True,
                                                "maximize": True}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adam-l2-amsgrad": (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.05, "amsgrad": True}),
    "adam-maximize": (torch.optim.Adam, {"lr": 0.01, "maximize": True}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adam-decoupled": (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1,
                                          "decoupled_weight_decay": True}),
    "rmsprop-wd": (torch.optim.RMSprop, {"lr": 0.01, "weight_decay": 0.05, "momentum": 0.5}),
    "adagrad-wd": (torch.optim.Adagrad, {"lr": 0.1, "weight_decay": 0.05}),
    "nadam": (torch.optim.NAdam, {"lr": 0.01, "weight_decay": 0.05}),
}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def take_step(net: nn.Module, optimizer: torch.optim.Optimizer, tracker: DirectionTracker,
              seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.randn(8, 5, dtype=torch.float64)
    optimizer.zero_grad(set_to_none=True)
    net(x).pow(2).mean().backward()
    tracker.before_step()
    optimizer.step()
    tracker.after_step()


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_direction_is_the_step_torch_took(setting: str) -> None:
    cls, kwargs = SETTINGS[setting]
    net = model()
    optimizer = cls(net.parameters(), **kwargs)
    tracker = DirectionTracker(optimizer, net.named_parameters())
    assert all(tracker.direction(n) is None for n, _ in net.named_parameters())  # no step yet
    for seed in range(4):
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        take_step(net, optimizer, tracker, seed)
        for name, param in net.named_parameters():
            taken = (before[name] - param.detach()) / kwargs["lr"]
            got = tracker.direction(name)
            assert got is not None
            torch.testing.assert_close(got, taken, rtol=1e-10, atol=1e-12)
        predicted = tracker.predict(3)
        for name, param in net.named_parameters():
            expected = param.detach() - 3 * (before[name] - param.detach())
            torch.testing.assert_close(predicted[name], expected, rtol=1e-10, atol=1e-12)
            assert not torch.equal(predicted[name], param.detach()), "plain SGD predicts too"


def test_prediction_follows_the_learning_rate_now() -> None:
    """``Ŵ = W - lr * s * ΔW`` with the group's lr at prediction time (schedulers apply)."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    tracker = DirectionTracker(optimizer, net.named_parameters())
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    take_step(net, optimizer, tracker, 0)
    optimizer.param_groups[0]["lr"] = 0.02
    for name, param in net.named_parameters():
        expected = param.detach() - 0.02 * 2 * (before[name] - param.detach()) / 0.1
        torch.testing.assert_close(tracker.predict(2)[name], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_spectrain_predicts_with_the_momentum_buffer_alone(nesterov: bool) -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov,
                                weight_decay=0.01)
    tracker = DirectionTracker(optimizer, net.named_parameters(), rule="momentum")
    for seed in range(3):
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        take_step(net, optimizer, tracker, seed)
    for name, param in net.named_parameters():
        buffer = optimizer.state[param]["momentum_buffer"]
        assert torch.equal(tracker.direction(name), buffer)
        taken = (before[name] - param.detach()) / 0.1
        assert torch.allclose(buffer, taken) is (not nesterov)  # Nesterov's step differs


@pytest.mark.parametrize("optimizer", [
    lambda ps: torch.optim.SGD(ps, lr=0.1),
    lambda ps: torch.optim.Adam(ps, lr=0.1),
])
def test_spectrain_refuses_optimizers_without_momentum(optimizer) -> None:
    net = model()
    with pytest.raises(ValueError, match="SpecTrain predicts with the SGD momentum buffer"):
        DirectionTracker(optimizer(net.parameters()), net.named_parameters(), rule="momentum")
