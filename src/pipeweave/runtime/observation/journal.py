"""A rank's journal: what it has done, appended to a file at every optimizer step.

A rank that is killed (SIGKILL, or SIGTERM from the launcher once a peer failed) runs no
cleanup, so what it returns at the end or attaches to its error never reaches the launcher.
The journal does: after each of its optimizer steps the rank appends one pickled frame with
what changed since the last (new micro-batch losses, new timeline records) and the current
value of everything else in its :class:`~.results.RankResult`; :func:`read_journal` merges the
frames back into one result, ignoring a last frame cut short by the kill. The launcher turns
that into the metrics, trace, plot and ``summary.json`` of the steps that completed.

Cost per step: one partial :class:`RankResult` (no parameters, no losses) and a pickle of
what is new, the same at every step; the file grows with the timeline, as the final result
does. The model state's bytes (``RankResult.state_bytes``, counted with
``Job.count_activations`` by walking every parameter and optimizer state tensor) are measured
at frames 1, 2, 4, 8, ... only and carried in between: the state is complete once the rank's
stages have stepped and does not change size after; walking it made a frame cost 0.41 ms of
CPU time instead of 0.05 ms (gpt-tiny on the CPU; ``benchmarks/rank_cost.py`` compares a
rank with the in-process run).
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...ir import Action
from .results import RankResult

if TYPE_CHECKING:
    from ..execution.parts import RankParts
    from ..execution.stage import StageRuntime

__all__ = ["StepJournal", "read_journal"]


class StepJournal:
    """Appends a frame to ``path`` after every optimizer step (an ``on_step`` hook).

    ``snapshot(state)`` gives the rank's result so far without its losses (and with
    ``state`` False, without walking the model state, module docstring); losses are read from
    ``parts``' stages, only the new ones: a loss dict keeps insertion order, so what was added
    since the last frame is at its end, and the last ``window`` entries are sent again in case
    a micro-batch's loss was still being summed (sliced micro-batches) or was redone. A frame
    thus costs the same at step 10 and at step 100,000.
    """

    def __init__(self, path: Path, snapshot: Callable[[bool], RankResult], parts: RankParts, *,
                 window: int) -> None:
        self.snapshot = snapshot
        self.parts = parts
        self.window = window
        self._handle = open(path, "ab")
        self._lengths: dict[int, int] = {}
        self._records = 0
        self._frames = 0
        self._state_bytes = 0

    def __call__(self, action: Action, stages: Mapping[int, StageRuntime]) -> None:
        self.write()

    def write(self) -> None:
        """Append what changed since the last frame (and flush it to the operating system,
        which keeps it when the process is killed)."""
        self._frames += 1
        measure = self._frames & (self._frames - 1) == 0  # frames 1, 2, 4, 8, ...
        result = self.snapshot(measure)
        if measure:
            self._state_bytes = result.state_bytes
        losses = self._new_losses()
        frame = replace(result, losses=losses.pop(0, {}), pipeline_losses=losses,
                        records=result.records[self._records:], state_bytes=self._state_bytes)
        self._records = len(result.records)
        pickle.dump(frame, self._handle, protocol=pickle.HIGHEST_PROTOCOL)
        self._handle.flush()

    def _new_losses(self) -> dict[int, dict[int, float]]:
        """Per pipeline (0, then AvgPipe's others), the losses added since the last frame and
        the last ``window`` before them."""
        # only the losses already computed: on a GPU the journal never waits (.execution.losses)
        sources = [(0, stage.loss_log.values(wait=False)) for stage in self.parts.stages.values()]
        sources += [(index, stage.loss_log.values(wait=False))
                    for index, other in enumerate(self.parts.pipelines[1:], 1)
                    for stage in other.stages.values()]
        new: dict[int, dict[int, float]] = {}
        for position, (pipeline, losses) in enumerate(sources):
            added = max(len(losses) - self._lengths.get(position, 0), 0)
            self._lengths[position] = len(losses)
            part = new.setdefault(pipeline, {})
            for key in itertools.islice(reversed(losses), added + self.window):
                part[key] = losses[key]
        return new

    def close(self) -> None:
        self._handle.close()


def read_journal(path: Path) -> RankResult | None:
    """The result a journal adds up to (None if it holds no whole frame)."""
    merged: RankResult | None = None
    try:
        with open(path, "rb") as handle:
            while True:
                frame: RankResult = pickle.load(handle)
                merged = frame if merged is None else _merge(merged, frame)
    except Exception:  # noqa: BLE001 - the end, or a frame the kill cut short (any error)
        pass
    return merged


def _merge(earlier: RankResult, frame: RankResult) -> RankResult:
    earlier.losses.update(frame.losses)
    for index, losses in frame.pipeline_losses.items():
        earlier.pipeline_losses.setdefault(index, {}).update(losses)
    earlier.records.extend(frame.records)
    return replace(frame, losses=earlier.losses, pipeline_losses=earlier.pipeline_losses,
                   records=earlier.records)
