"""A tqdm progress bar fed by the interpreter's optimizer steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tqdm import tqdm

from ...ir import Action

if TYPE_CHECKING:
    from ..execution.stage import StageRuntime

__all__ = ["StepProgress"]


class StepProgress:
    """Advances one tick per update of ``stage``, showing the latest iteration's loss."""

    def __init__(self, *, total: int, stage: int, microbatches: int) -> None:
        self.stage = stage
        self.microbatches = microbatches
        self.bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, leave=True)

    def __call__(self, action: Action, stages: Mapping[int, StageRuntime]) -> None:
        if action.stage != self.stage:
            return
        losses = stages[self.stage].loss_log.values(wait=False)  # never stall a GPU
        if losses:
            iteration = max(losses) // self.microbatches
            first = iteration * self.microbatches
            loss = sum(losses.get(j, 0.0) for j in range(first, first + self.microbatches))
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
