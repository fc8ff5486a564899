"""The held-out loss of a run (``pipeweave train --eval-every N``), computed in the launcher
from the weights the ranks copied after the chosen steps (:mod:`..checkpoint.snapshots`).

Design: the ranks train without pausing; at each chosen step boundary they copy their stages'
parameters, which come back with their results. Here the whole model is built once, each
step's parameters are loaded into it, and the mean loss over the first ``batches`` held-out
batches is computed in one process, in eval mode (no dropout) under ``torch.no_grad``, in the
model's dtype, on the run's device. It is the loss of exactly the weights the pipeline had
after that step; the cost is a copy of the weights per evaluated step, held until the run
ends, and one whole model in the launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from ...models import ModelSpec

__all__ = ["held_out_losses"]


def held_out_losses(model: Callable[[], ModelSpec], data: Callable[[], Iterable[tuple[Tensor, Tensor]]],
                    snapshots: Mapping[int, Mapping[str, Tensor]], *, batches: int,
                    device: torch.device | None = None) -> dict[int, float]:
    """Step -> mean loss of the model at that step's weights over ``batches`` batches of
    ``data`` (the same batches for every step), computed on ``device`` (default: the CPU)."""
    if not snapshots:
        return {}
    spec = model().materialized(device if device is not None else "cpu")
    network = spec.sequential().eval().to(device)
    stream = iter(data())
    held = [(x.to(device), y.to(device)) for x, y in (next(stream) for _ in range(batches))]
    losses: dict[int, float] = {}
    with torch.no_grad():
        for step in sorted(snapshots):
            missing, _ = network.load_state_dict(dict(snapshots[step]), strict=False)
            absent = sorted(set(missing) & {n for n, _ in network.named_parameters()})
            assert not absent, f"step {step}: no rank copied {absent[:3]}"
            total = sum(float(spec.loss_fn(network(x), y)) for x, y in held)
            losses[step] = total / len(held)
    return losses
