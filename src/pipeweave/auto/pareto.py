"""The time/memory Pareto front of the simulated candidates, and its PNG.

A candidate is on the front when no other is both at least as fast (predicted samples/s) and
at most as large (predicted peak memory of its fullest rank), and strictly better in one: the
front is the best speed each memory budget can buy. Reading the plot: every simulated
candidate (and the default plan, always predicted) is a grey dot; pruned candidates were
never simulated, so they are not drawn; the front a line, the winner a star, the default plan (1F1B, uniform)
a square, and ``--memory-limit`` a vertical line; candidates right of it were never chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..collector import paused_collection
from .predict import Prediction

__all__ = ["pareto_front", "plot_pareto"]


def pareto_front(predictions: Sequence[Prediction]) -> list[Prediction]:
    """The non-dominated predictions, by increasing memory."""
    front: list[Prediction] = []
    best = -1.0
    for p in sorted(predictions, key=lambda p: (p.max_memory, -p.samples_per_second)):
        if p.samples_per_second > best:
            front.append(p)
            best = p.samples_per_second
    return front


@paused_collection()  # after a search the heap holds its caches: matplotlib's many small
# objects made the collector rescan them (3 s of the planning-scale command, 2026-11-27)
def plot_pareto(predictions: Sequence[Prediction], path: str | Path, *,
                winner: Prediction | None = None, default: Prediction | None = None,
                memory_limit: float | None = None, title: str = "") -> Path:
    """Draw the candidates and their front to ``path`` (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2.0 ** 20
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p.max_memory / mib for p in predictions],
               [p.samples_per_second for p in predictions], s=10, c="0.7", label="candidates")
    front = pareto_front(predictions)
    ax.plot([p.max_memory / mib for p in front], [p.samples_per_second for p in front],
            "-o", c="tab:blue", ms=4, label="Pareto front")
    if default is not None:
        ax.scatter([default.max_memory / mib], [default.samples_per_second], marker="s", s=60,
                   c="tab:orange", label="default (1f1b, uniform)", zorder=3)
    if winner is not None:
        ax.scatter([winner.max_memory / mib], [winner.samples_per_second], marker="*", s=160,
                   c="tab:red", label=f"winner ({winner.candidate.schedule})", zorder=4)
    if memory_limit is not None:
        ax.axvline(memory_limit / mib, c="k", ls="--", lw=1, label="--memory-limit")
    ax.set_xlabel("predicted peak memory of the fullest rank (MiB)")
    ax.set_ylabel("predicted samples/s")
    ax.set_title(title or "pipeweave auto: time/memory Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
