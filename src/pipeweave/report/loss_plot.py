"""Loss curves as PNG (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["plot_losses"]


def plot_losses(curves: Mapping[str, Sequence[float]], path: str | Path, *,
                xlabel: str = "step", title: str = "training loss",
                x_values: Mapping[str, Sequence[float]] | None = None) -> Path:
    """One line per curve; ``x_values`` gives each curve's x axis (default: 1, 2, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for label, values in curves.items():
        xs = list(x_values[label]) if x_values and label in x_values else list(range(1, len(values) + 1))
        axis.plot(xs, list(values), label=label)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("loss")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
