"""Elastic averaging over N parallel pipelines (AvgPipe §3.2), one stage on one rank.

Each of the N parallel models of a stage takes its own optimizer step (local update
``δ = w_after - w_before``) and is then pulled towards the reference model of the previous
iteration by ``α`` (default ``1/N``), in the elastic-averaging form::

    w  <-  w + δ - α (w - w_ref)          (order "simultaneous", the default)

i.e. the dilution uses the weights *before* the local update. The paper leaves the order open;
``order="update-then-dilute"`` applies the update first and dilutes the updated weights,
``w <- (w + δ) - α ((w + δ) - w_ref)``.

**The reference model.** AvgPipe §3.2 says two things of it: "each weight in the reference
model stays the average of the corresponding weights in parallel models", and its process
"normalizes and applies the accumulated update" once every pipeline has sent its local update
(Step 3). We implement the second, the mechanism, in both orders::

    w_ref  <-  w_ref + (1/N) Σ_p δ_p

* With the default order the two statements agree: if ``w_ref`` is the mean of the models,
  the mean of ``w + δ - α (w - w_ref)`` is ``w_ref + mean δ`` — and it is the mean from the
  start, since every parallel model begins as a copy of one initial model. We compute it as
  the mean of the models (the same number, exactly as the paper's first sentence says), so
  that rounding cannot make the two drift and N = 1 reduces bit for bit to the plain pipeline.
* With ``update-then-dilute`` they cannot both hold: the mean of the diluted models moves by
  only ``(1 - α) mean δ``. The reference takes the accumulated update (Step 3) and is then
  *not* the mean of the parallel models; the models are pulled toward it each iteration.

All parallel models of a stage live on the same rank (AvgPipe co-partitions the pipelines),
so the contributions never leave the rank and never block the pipeline. The reference model is
what is evaluated and reported.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ...planner.semantics_options import AVERAGE_ORDERS as ORDERS

__all__ = ["ElasticAverager", "ORDERS"]


class ElasticAverager:
    """Reference model and averaging rule for one stage's N parallel models."""

    def __init__(self, *, stage: int, pipelines: int, initial: nn.Module,
                 alpha: float | None = None, order: str = "simultaneous") -> None:
        if order not in ORDERS:
            raise ValueError(f"averaging order {order!r} unknown; choose one of {ORDERS}")
        alpha = 1.0 / pipelines if alpha is None else float(alpha)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must lie in [0, 1]; the paper's default is 1/N")
        self.stage = stage
        self.pipelines = pipelines
        self.alpha = alpha
        self.order = order
        self.reference = {n: p.detach().clone() for n, p in initial.named_parameters()}
        self.iteration = 0  # iterations folded into the reference
        self._before: dict[int, dict[str, Tensor]] = {}
        self._sum: dict[str, Tensor] = {}
        self._count = 0

    def before_step(self, pipeline: int, module: nn.Module) -> None:
        """Remember the pipeline's weights before its local update."""
        self._before[pipeline] = {n: p.detach().clone() for n, p in module.named_parameters()}

    def average(self, pipeline: int, module: nn.Module, version: int) -> None:
        """Pull ``module`` (just updated) towards the reference; fold it into the next reference."""
        if version - 1 != self.iteration:
            raise RuntimeError(
                f"stage {self.stage}: averaging for iteration {version - 1} of pipeline "
                f"{pipeline} while the reference has folded {self.iteration} iterations; the "
                f"schedule must average every pipeline of an iteration before the next one"
            )
        before = self._before.pop(pipeline)
        simultaneous = self.order == "simultaneous"
        with torch.no_grad():
            for name, param in module.named_parameters():
                if simultaneous:  # dilute from before the update; fold in the diluted model
                    param.sub_(self.alpha * (before[name] - self.reference[name]))
                    contribution = param.detach()
                else:  # dilute the updated weights; fold in the local update δ
                    contribution = param.detach() - before[name]
                    param.sub_(self.alpha * (param.detach() - self.reference[name]))
                if name in self._sum:
                    self._sum[name] += contribution
                else:
                    self._sum[name] = contribution.clone()
        self._count += 1
        if self._count == self.pipelines:
            if simultaneous:
                self.reference = {n: s / self.pipelines for n, s in self._sum.items()}
            else:
                self.reference = {n: self.reference[n] + s / self.pipelines
                                  for n, s in self._sum.items()}
            self._sum, self._count = {}, 0
            self.iteration += 1

    def reference_parameters(self) -> Mapping[str, Tensor]:
        return self.reference

    # -- checkpoints (runtime/checkpoint/recovery.py) ----------------------------------------------------
    @property
    def between_iterations(self) -> bool:
        """Whether every pipeline has averaged for the iterations folded so far: then the
        reference and :attr:`iteration` are the whole state (no weights remembered by
        :meth:`before_step`, no partial sum), which is what a checkpoint saves."""
        return not self._before and not self._sum and self._count == 0

    def load_reference(self, reference: Mapping[str, Tensor], iteration: int) -> None:
        """Continue from a checkpoint: the reference after ``iteration`` folded iterations."""
        if not self.between_iterations:
            raise RuntimeError(f"stage {self.stage}: cannot load a reference model in the middle "
                               f"of iteration {self.iteration}")
        if set(reference) != set(self.reference):
            raise ValueError(f"stage {self.stage}: the reference model to load has parameters "
                             f"{sorted(reference)}, this stage has {sorted(self.reference)}")
        with torch.no_grad():
            for name, tensor in reference.items():
                self.reference[name].copy_(tensor)
        self.iteration = iteration
