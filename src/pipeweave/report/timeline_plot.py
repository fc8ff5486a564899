"""PNG timeline of a schedule run: one row per rank, one bar per action (matplotlib, Agg).

Like the chrome trace it takes plain records ``(rank, action text, start, end)``, simulated or
measured. Colours follow the micro-batch (so a micro-batch can be followed down the pipeline
and back); forwards are solid, backwards lighter and hatched (a split backward's input
gradient ``I`` like ``B``, its weight gradient ``W`` cross-hatched), updates/all-reduces grey, and
sends/receives are left out (they are instants in a simulation)::

    rank0 |F0|F1|F2|     |B0|B1|B2|U
    rank1    |F0|F1|F2|B0|B1|B2|   U
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..ir import parse_action  # noqa: E402

__all__ = ["plot_timeline"]

_LABELS_UP_TO = 160
"""Bars are labelled with their micro-batch when the plot has at most this many."""
_LEGEND_MICROBATCHES = 8
_HATCH = {"B": "//", "I": "//", "W": "xx"}
"""Hatching of backward bars: a split backward's input gradient as a whole one, its weight
gradient apart."""


def plot_timeline(
    records: Iterable[Sequence[Any]],
    path: str | Path,
    *,
    title: str = "pipeline timeline",
    time_label: str = "time",
) -> Path:
    """Draw ``records`` to a PNG at ``path`` and return the path.

    Args:
        records: ``(rank, action text, start, end)`` tuples.
        path: output file (``.png``).
        title: figure title (e.g. ``"1f1b, P=4, M=8"``).
        time_label: x-axis label (``"time (s)"`` for measured runs, cost units when simulated).
    """
    bars: dict[tuple[int, str, int], list[tuple[float, float]]] = defaultdict(list)
    labels: list[tuple[int, float, float, str]] = []
    ranks: set[int] = set()
    microbatches: set[int] = set()
    for record in records:
        rank, text, start, end = int(record[0]), str(record[1]), float(record[2]), float(record[3])
        ranks.add(rank)
        kind, mb, label = _classify(text)
        if kind == "comm":
            continue
        if mb >= 0:
            microbatches.add(mb)
        bars[(rank, kind, mb)].append((start, end - start))
        if label:
            labels.append((rank, start, end, label))
    if not ranks:
        raise ValueError("no records to plot; give at least one (rank, action, start, end)")

    n_ranks = max(ranks) + 1
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * n_ranks))
    cmap = matplotlib.colormaps["tab20"]
    for (rank, kind, mb), spans in bars.items():
        y = n_ranks - 1 - rank  # rank 0 on top
        style: dict[str, Any]
        if kind == "F":
            style = {"facecolors": cmap(mb % 20), "edgecolor": "black", "linewidth": 0.3}
        elif kind in _HATCH:
            style = {"facecolors": cmap(mb % 20), "alpha": 0.55, "hatch": _HATCH[kind],
                     "edgecolor": "black", "linewidth": 0.3}
        else:
            style = {"facecolors": "0.6", "edgecolor": "0.3", "linewidth": 0.3}
        ax.broken_barh(spans, (y - 0.4, 0.8), **style)
    if len(labels) <= _LABELS_UP_TO:
        for rank, start, end, text in labels:
            ax.text((start + end) / 2, n_ranks - 1 - rank, text, ha="center", va="center",
                    fontsize=7)

    ax.set_yticks(range(n_ranks))
    ax.set_yticklabels([f"rank {r}" for r in reversed(range(n_ranks))])
    ax.set_xlabel(time_label)
    ax.set_ylabel("rank")
    ax.set_title(title)
    ax.set_ylim(-0.6, n_ranks - 0.4)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    handles = [
        Patch(facecolor="white", edgecolor="black", label="forward (solid)"),
        Patch(facecolor="white", edgecolor="black", hatch="//", label="backward (hatched)"),
        Patch(facecolor="0.6", edgecolor="0.3", label="update / all-reduce"),
    ]
    if any(kind == "W" for _, kind, _ in bars):
        handles.insert(2, Patch(facecolor="white", edgecolor="black", hatch="xx",
                                label="weight gradient W (cross-hatched)"))
    shown = sorted(microbatches)[:_LEGEND_MICROBATCHES]
    handles += [Patch(facecolor=cmap(mb % 20), label=f"micro-batch {mb}") for mb in shown]
    if len(microbatches) > len(shown):
        handles.append(Patch(facecolor="white", edgecolor="white",
                             label=f"... ({len(microbatches)} micro-batches)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _classify(text: str) -> tuple[str, int, str]:
    """``(kind, micro-batch or -1, bar label)``; kind is F, B, I, W, comm or other."""
    try:
        action = parse_action(text)
    except ValueError:
        return "other", -1, ""
    if action.is_comm:
        return "comm", -1, ""
    if not action.is_compute:
        return "other", -1, ""
    assert action.microbatch is not None
    half = "ab"[action.piece - 1] if action.piece else ""
    return action.op.value, action.microbatch, f"{action.microbatch}{half}"
