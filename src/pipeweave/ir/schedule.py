"""Schedule: per-rank action lists plus the shape they were generated for.

A schedule is plain, immutable data. The simulator and the runtime are two interpreters of it;
neither ever re-derives the order of actions.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .actions import Action, parse_action
from .layout import Layout

__all__ = ["Schedule", "render_grid", "schedule_to_csv", "schedule_from_csv"]


@dataclass(frozen=True)
class Schedule:
    """Ordered actions for every rank.

    Attributes:
        name: the generator that produced it (e.g. ``"1f1b"``).
        layout: which ranks host which stages.
        microbatches: micro-batches per iteration (per parallel pipeline).
        iterations: how many iterations the programs cover.
        programs: ``programs[r]`` is rank ``r``'s ordered action list.
        pipelines: number of parallel pipelines sharing the ranks (AvgPipe's N).
        synchronous: True when every iteration ends with a flush (all backwards, then the
            update), so gradients equal non-pipelined training.
        lowered: True once sends/receives have been inserted (see :mod:`pipeweave.ir.lower`).
        options: the generator's extra parameters, for the record (e.g. ``{"advance": 2}``).
    """

    name: str
    layout: Layout
    microbatches: int
    iterations: int
    programs: tuple[tuple[Action, ...], ...]
    pipelines: int = 1
    synchronous: bool = True
    lowered: bool = False
    options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.programs) != self.layout.num_ranks:
            raise ValueError(
                f"schedule has {len(self.programs)} programs but its layout has "
                f"{self.layout.num_ranks} ranks"
            )

    @property
    def num_ranks(self) -> int:
        return self.layout.num_ranks

    @property
    def num_stages(self) -> int:
        return self.layout.num_stages

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Every ``(rank, position, action)``."""
        for rank, program in enumerate(self.programs):
            for position, action in enumerate(program):
                yield rank, position, action

    def compute_only(self) -> "Schedule":
        """The same schedule with sends/receives removed."""
        programs = tuple(tuple(a for a in p if not a.is_comm) for p in self.programs)
        return replace(self, programs=programs, lowered=False)

    def with_programs(self, programs: Sequence[Sequence[Action]], **changes: object) -> "Schedule":
        return replace(self, programs=tuple(tuple(p) for p in programs), **changes)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return render_grid(self)


def render_grid(
    schedule: Schedule,
    *,
    marked: Iterable[tuple[int, int]] = (),
    compute_only: bool = False,
    max_columns: int | None = None,
) -> str:
    """Rank-by-step grid; cells at ``(rank, position)`` in ``marked`` are flagged ``>x<``.

    Example (GPipe, P=2, M=2)::

        step    0    1    2    3    4
        rank0  0F0  0F1  0B0  0B1  0U@1
        rank1  1F0  1F1  1B0  1B1  1U@1
    """
    marks = set(marked)
    rows: list[list[str]] = []
    for rank, program in enumerate(schedule.programs):
        row = []
        for position, action in enumerate(program):
            if compute_only and action.is_comm:
                continue
            text = str(action)
            row.append(f">{text}<" if (rank, position) in marks else text)
        rows.append(row)
    width = max((len(c) for row in rows for c in row), default=3)
    steps = max((len(r) for r in rows), default=0)
    shown = steps if max_columns is None else min(steps, max_columns)
    label = max(len(f"rank{len(rows) - 1}"), 4)
    lines = ["step".ljust(label) + "".join(f" {i:>{width}}" for i in range(shown))]
    for rank, row in enumerate(rows):
        cells = "".join(f" {c:>{width}}" for c in row[:shown])
        more = " ..." if len(row) > shown else ""
        lines.append(f"rank{rank}".ljust(label) + cells + more)
    return "\n".join(lines)


def schedule_to_csv(schedule: Schedule, path: str | Path | None = None) -> str:
    """One row per rank, one action per cell (the text form). Writes ``path`` if given."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for program in schedule.programs:
        writer.writerow([str(a) for a in program])
    text = buffer.getvalue()
    if path is not None:
        Path(path).write_text(text)
    return text


def schedule_from_csv(text: str, *, template: Schedule) -> Schedule:
    """Read programs written by :func:`schedule_to_csv`; shape fields come from ``template``."""
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) != template.num_ranks:
        raise ValueError(f"CSV has {len(rows)} rows but the schedule has {template.num_ranks} ranks")
    programs = [tuple(parse_action(cell) for cell in row if cell.strip()) for row in rows]
    lowered = any(a.is_comm for p in programs for a in p)
    return template.with_programs(programs, lowered=lowered)
