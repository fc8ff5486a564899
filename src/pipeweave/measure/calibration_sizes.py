"""The compute scale of a distributed run by micro-batch size, fitted from the calibration's
two data-parallel plans.

The calibration's ``data-parallel`` and ``data-parallel-small`` plans are the same plan (the
whole model on every rank) at the default's M and at the largest M the search tries: every
rank busy alike, no message between stages, only the micro-batch size and the number of
actions differ. Each round fits each of them its own compute scale (its timeline's compute
against the simulated, :mod:`.calibration_rounds`), and on this machine the two differ by
size, not by load (2026-11-27, quiet, ``benchmarks/auto_predict.py``, per round at 2 ranks:
gpt-tiny 0.94-1.16 at 4 samples against 0.71-1.03 at 1, cnn 0.92-1.04 against 0.76-0.88;
gpt-small 0.99-1.10 against 0.92-1.03): the profile, which times each block alone, prices
small micro-batches high against what the runtime's actions take. One scale, the median of
every plan's, then priced the smallest micro-batches slow and the default's size fast, and
the largest (the data-parallel winners, 8 samples) by whichever plan the median fell on.

So the scale is kept per size (:func:`size_scale_values`): per size the median of its plan's
rounds; ``RuntimeCosts.compute_scale`` the least of them and ``RuntimeCosts.size_scales`` the
factor of each size over it (>= 1, so the search's bounds from the profile's times stay
bounds, as a scale below 1 goes into the blocks' times: :func:`.calibration_runs.with_costs`),
linear in the logarithm of the size between the two and the nearest outside them
(``RuntimeCosts.size_factor``). The default plan, a pipeline at the data-parallel plan's size,
computes at that plan's scale; what its received messages add is ``compute_per_receive``
(:func:`.calibration_runs._borrowed`).

Before (2026-11-27, until 22:36 UTC) a fixed compute per action, ``compute_per_action``, was
fitted from the same two plans in closed form, at least 0, and kept only where it priced the
calibration's own runs better: on the quiet runs it was 0 in 14 of 18 and its one large
value (17 ms, gpt-small at 4 ranks) priced the default at 899 ms where it ran 464, since the
small micro-batches ran *faster* than the profile said, not slower. The field stays in
``RuntimeCosts`` (saved profiles carry it, the planner applies it); the calibration no longer
fits it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["PER_ACTION", "SIZE_SCALE", "size_scale_values", "size_scales_of"]

PER_ACTION = "compute_per_action"
"""``RuntimeCosts.compute_per_action``'s name among fitted values (the calibration holds it
at 0)."""

SIZE_SCALE = "size_scale@{}"
"""The fitted values' name of the factor at a micro-batch size (``RuntimeCosts.size_scales``)."""


def size_scale_values(sizes: Mapping[str, int],
                      rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The compute scale by micro-batch size: ``sizes`` maps each plan that computes at its
    own scale (``compute_scale@label`` in every round of ``rounds``) to its samples per
    micro-batch; per size the median of its plans' rounds. Returned as ``compute_scale``, the
    least of them, and ``size_scale@N`` per size, the factor over it (>= 1); empty where the
    plans span fewer than two sizes (one scale serves every size)."""
    by_size: dict[int, list[float]] = {}
    for label, size in sizes.items():
        by_size.setdefault(size, []).extend(one[f"compute_scale@{label}"] for one in rounds)
    if len(by_size) < 2:
        return {}
    scales = {size: statistics.median(values) for size, values in by_size.items()}
    least = min(scales.values())
    return {"compute_scale": least, **{SIZE_SCALE.format(size): scale / least
                                       for size, scale in sorted(scales.items())}}


def size_scales_of(values: Mapping[str, float]) -> tuple[tuple[int, float], ...]:
    """The ``size_scale@N`` entries of fitted ``values`` as ``RuntimeCosts.size_scales``."""
    prefix = SIZE_SCALE.format("")
    return tuple(sorted((int(name[len(prefix):]), value) for name, value in values.items()
                        if name.startswith(prefix)))
