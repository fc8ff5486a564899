"""Small classifiers for scikit-learn's 8x8 digits, cut into pipeline blocks.

Both models take flat features ``[B, 64]`` (what :mod:`pipeweave.data.digits` yields) and
return logits ``[B, 10]``; both have at least four blocks so they can be split over four ranks::

    mlp:  [B, 64] -> fc0 -> fc1 -> fc2 -> head -> [B, 10]        (Linear+ReLU, ..., Linear)
    cnn:  [B, 64] -> conv0 [B,16,8,8] -> conv1 [B,32,4,4] -> conv2 [B,32,2,2]
                  -> fc [B, 64] -> head [B, 10]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CNNConfig",
    "MLPConfig",
    "ToImage",
    "classification_loss",
    "cnn_blocks",
    "mlp_blocks",
]


def _check_positive(owner: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{field}={value!r} is invalid; pass an int >= 1")


@dataclass(frozen=True)
class MLPConfig:
    """Shape of the multi-layer perceptron; validated on construction."""

    in_features: int = 64
    """Input features per example (64 pixels for 8x8 digits)."""

    hidden: int = 128
    """Width of every hidden layer."""

    n_hidden_layers: int = 3
    """Number of Linear+ReLU blocks before the output block (total blocks = this + 1)."""

    n_classes: int = 10
    """Number of output logits."""

    def __post_init__(self) -> None:
        for field in ("in_features", "hidden", "n_hidden_layers", "n_classes"):
            _check_positive("MLPConfig", field, getattr(self, field))


@dataclass(frozen=True)
class CNNConfig:
    """Shape of the convolutional classifier; validated on construction."""

    image_size: int = 8
    """Side of the square single-channel image; inputs are ``[B, image_size**2]``.
    Must be divisible by 4 (two 2x2 max-pools)."""

    channels: tuple[int, int, int] = (16, 32, 32)
    """Output channels of the three 3x3 convolution blocks."""

    hidden: int = 64
    """Width of the fully connected layer before the output block."""

    n_classes: int = 10
    """Number of output logits."""

    def __post_init__(self) -> None:
        _check_positive("CNNConfig", "image_size", self.image_size)
        _check_positive("CNNConfig", "hidden", self.hidden)
        _check_positive("CNNConfig", "n_classes", self.n_classes)
        if self.image_size % 4 != 0:
            raise ValueError(
                f"CNNConfig.image_size={self.image_size} is not divisible by 4; the two 2x2 "
                f"max-pools need it (the digits images are 8)"
            )
        if len(self.channels) != 3:
            raise ValueError(f"CNNConfig.channels={self.channels!r} must hold exactly 3 ints")
        for c in self.channels:
            _check_positive("CNNConfig", "channels", c)


class ToImage(nn.Module):
    """Reshape flat pixels ``[B, size*size]`` into single-channel images ``[B, 1, size, size]``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.size * self.size:
            raise ValueError(
                f"expected flat pixels of shape [batch, {self.size * self.size}]; "
                f"got {tuple(x.shape)}"
            )
        return x.reshape(x.shape[0], 1, self.size, self.size)


def mlp_blocks(config: MLPConfig) -> tuple[list[nn.Module], list[str]]:
    """Build the MLP's blocks and their names (``fc0``, ..., ``head``)."""
    blocks: list[nn.Module] = []
    names: list[str] = []
    width = config.in_features
    for i in range(config.n_hidden_layers):
        blocks.append(nn.Sequential(nn.Linear(width, config.hidden), nn.ReLU()))
        names.append(f"fc{i}")
        width = config.hidden
    blocks.append(nn.Linear(width, config.n_classes))
    names.append("head")
    return blocks, names


def cnn_blocks(config: CNNConfig) -> tuple[list[nn.Module], list[str]]:
    """Build the CNN's blocks and their names (``conv0``, ``conv1``, ``conv2``, ``fc``,
    ``head``)."""
    c0, c1, c2 = config.channels
    pooled = config.image_size // 4
    blocks: list[nn.Module] = [
        nn.Sequential(ToImage(config.image_size), nn.Conv2d(1, c0, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(c0, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(c2 * pooled * pooled, config.hidden), nn.ReLU()),
        nn.Linear(config.hidden, config.n_classes),
    ]
    return blocks, ["conv0", "conv1", "conv2", "fc", "head"]


def classification_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits ``[B, C]`` against int64 class labels ``[B]``."""
    return F.cross_entropy(logits, targets)
