"""How many micro-batches one optimizer step consumes, read off the schedule itself.

The learning rate means what it means to ``torch.optim`` for the samples one update sees
(DESIGN.md, "update period"): an update applies the gradient of the *mean* loss over exactly
those samples. Which samples that is depends on the schedule, so it is counted from the data,
never declared: for every ``(stage, pipeline)``, the micro-batches whose weight gradients (``B`` or ``W``) ran on the
stage since its previous ``U``, summed over the stage's replicas (an ``AR`` before the ``U``
sums their gradients).

    gpipe / 1f1b / interleaved / sliced / 2bw / wpipe / avgpipe     M  (one batch per update)
    pipedream / pipeoptim / spectrain, straight                     1  (one micro-batch)
    pipedream 1F1B-RR, stage with r replicas                        r  (one round)
"""

from __future__ import annotations

from collections import defaultdict

from .actions import WEIGHT_GRADIENT_OPS, Op
from .schedule import Schedule

__all__ = ["update_sizes"]


def update_sizes(schedule: Schedule) -> dict[tuple[int, int], int]:
    """``(stage, pipeline) -> micro-batches`` per optimizer step (module docstring).

    Raises ``ValueError`` if a stage's steps consume different numbers of micro-batches (the
    learning rate would then mean different things at different steps).
    """
    # per (stage, pipeline): the n-th step's micro-batch count on each replica, summed
    per_step: dict[tuple[int, int], list[int]] = defaultdict(list)
    for program in schedule.programs:
        pending: dict[tuple[int, int], set[int]] = defaultdict(set)
        steps: dict[tuple[int, int], int] = defaultdict(int)
        for action in program:
            key = (action.stage, action.pipeline)
            if action.op in WEIGHT_GRADIENT_OPS and action.microbatch is not None:
                pending[key].add(action.microbatch)
            elif action.op is Op.STEP:
                counts = per_step[key]
                index = steps[key]
                if index == len(counts):
                    counts.append(0)
                counts[index] += len(pending.pop(key, ()))
                steps[key] += 1
    sizes: dict[tuple[int, int], int] = {}
    for key, counts in sorted(per_step.items()):
        distinct = sorted(set(counts))
        if len(distinct) != 1:
            stage, pipeline = key
            raise ValueError(
                f"schedule {schedule.name!r}: the updates of stage {stage} (pipeline {pipeline}) "
                f"consume {distinct} micro-batches; every update must see the same number so that "
                f"the learning rate means one thing"
            )
        sizes[key] = distinct[0]
    return sizes
