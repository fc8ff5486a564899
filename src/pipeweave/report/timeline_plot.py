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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

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


class _Bar(NamedTuple):
    """Which bars share a colour and hatch: one rank's actions of a kind and micro-batch."""

    rank: int
    kind: str
    microbatch: int


class _Label(NamedTuple):
    rank: int
    start: float
    end: float
    text: str


@dataclass
class _Bars:
    """The records, sorted into bars (spans of ``(start, width)``) and labels."""

    spans: dict[_Bar, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    labels: list[_Label] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    microbatches: set[int] = field(default_factory=set)


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
    bars = _bars(records)
    if not bars.ranks:
        raise ValueError("no records to plot; give at least one (rank, action, start, end)")
    n_ranks = max(bars.ranks) + 1
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * n_ranks))
    cmap = matplotlib.colormaps["tab20"]
    _draw(ax, bars, n_ranks, cmap)
    ax.set_yticks(range(n_ranks))
    ax.set_yticklabels([f"rank {r}" for r in reversed(range(n_ranks))])
    ax.set_xlabel(time_label)
    ax.set_ylabel("rank")
    ax.set_title(title)
    ax.set_ylim(-0.6, n_ranks - 0.4)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.legend(handles=_legend(bars, cmap), loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(records: Iterable[Sequence[Any]]) -> _Bars:
    bars = _Bars()
    for record in records:
        rank_field, text_field, start_field, end_field = record
        rank, start, end = int(rank_field), float(start_field), float(end_field)
        bars.ranks.add(rank)
        kind, mb, label = _classify(str(text_field))
        if kind == "comm":
            continue
        if mb >= 0:
            bars.microbatches.add(mb)
        bars.spans[_Bar(rank, kind, mb)].append((start, end - start))
        if label:
            bars.labels.append(_Label(rank, start, end, label))
    return bars


def _draw(ax: Any, bars: _Bars, n_ranks: int, cmap: Any) -> None:
    """The bars, rank 0 on top, and their labels where there are few."""
    for bar, spans in bars.spans.items():
        y = n_ranks - 1 - bar.rank
        style: dict[str, Any]
        if bar.kind == "F":
            style = {"facecolors": cmap(bar.microbatch % 20), "edgecolor": "black",
                     "linewidth": 0.3}
        elif bar.kind in _HATCH:
            style = {"facecolors": cmap(bar.microbatch % 20), "alpha": 0.55,
                     "hatch": _HATCH[bar.kind], "edgecolor": "black", "linewidth": 0.3}
        else:
            style = {"facecolors": "0.6", "edgecolor": "0.3", "linewidth": 0.3}
        ax.broken_barh(spans, (y - 0.4, 0.8), **style)
    if len(bars.labels) <= _LABELS_UP_TO:
        for label in bars.labels:
            ax.text((label.start + label.end) / 2, n_ranks - 1 - label.rank, label.text,
                    ha="center", va="center", fontsize=7)


def _legend(bars: _Bars, cmap: Any) -> list[Patch]:
    handles = [
        Patch(facecolor="white", edgecolor="black", label="forward (solid)"),
        Patch(facecolor="white", edgecolor="black", hatch="//", label="backward (hatched)"),
        Patch(facecolor="0.6", edgecolor="0.3", label="update / all-reduce"),
    ]
    if any(bar.kind == "W" for bar in bars.spans):
        handles.insert(2, Patch(facecolor="white", edgecolor="black", hatch="xx",
                                label="weight gradient W (cross-hatched)"))
    shown = sorted(bars.microbatches)[:_LEGEND_MICROBATCHES]
    handles += [Patch(facecolor=cmap(mb % 20), label=f"micro-batch {mb}") for mb in shown]
    if len(bars.microbatches) > len(shown):
        handles.append(Patch(facecolor="white", edgecolor="white",
                             label=f"... ({len(bars.microbatches)} micro-batches)"))
    return handles


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
