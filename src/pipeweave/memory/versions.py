"""Weight versions a schedule keeps, read off its actions' version tags (no per-schedule table).

* :func:`weight_versions`: per stage, the most weight sets one copy of the stage holds at once
  (the simulator reports it, ``sim.metrics.weight_versions``);
* :func:`weight_copies`: per stage, the sets held besides the live parameters, as
  :mod:`pipeweave.runtime.execution.weights` allocates them: the versions less the live one,
  plus one where a forward at the live version has an update of the stage before its backward
  (the runtime runs that forward on a copy: autograd keeps the tensors it ran on and the
  update is in place). The runtime builds replicas once and keeps them, so the peak count
  holds for the whole run.
"""

from __future__ import annotations

from ..ir import COMPUTE_OPS, GRADIENT_OPS, Op, Schedule

__all__ = ["weight_versions", "weight_copies"]

_F, _B, _W, _U = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_WEIGHT, Op.STEP


def weight_versions(schedule: Schedule, *, keep_predicted: bool = False) -> list[int]:
    """Per stage: the most weight sets one copy of the stage holds at once.

    Held at a point of a rank's program: the current version (the number of the stage's
    updates so far), every older version that an action at or after that point still names
    (a stashed backward, or a vertical-sync/2BW/WPipe forward on an old version — those
    must be kept from the update that retires them until their last use, even before the
    micro-batch reaches the stage), and one transient set while a forward or backward runs
    on predicted weights (``lookahead`` > 0: PipeOptim, SpecTrain). This is what the
    runtime's :class:`pipeweave.runtime.execution.weights.StageWeights` keeps. With ``keep_predicted``
    (PipeOptim's ``backward="graph"``) a predicted forward's set is kept until the backward of
    its micro-batch instead (of a split backward, its ``W``; ``I`` and ``W`` name versions as
    ``B`` does). The maximum is taken over replicas and parallel pipelines (each
    pipeline keeps its own copy).
    """
    peak = [0] * schedule.num_stages
    for program in schedule.programs:
        last_use: dict[tuple[int, int, int], int] = {}
        for position, action in enumerate(program):
            op, stage, _, _, version, _, pipeline = action
            if op in COMPUTE_OPS and version is not None:
                last_use[(stage, pipeline, version)] = position
        current: dict[tuple[int, int], int] = {}
        old: dict[tuple[int, int], set[int]] = {}
        predicted: dict[tuple[int, int], set[tuple[int | None, int]]] = {}
        for position, action in enumerate(program):
            op, stage, microbatch, piece, version, lookahead, pipeline = action
            if op is not _U and op not in COMPUTE_OPS:
                continue
            key = (stage, pipeline)
            now = current.setdefault(key, 0)
            kept = old.setdefault(key, set())
            kept.difference_update([v for v in kept if last_use[(stage, pipeline, v)] < position])
            in_flight = predicted.setdefault(key, set())
            if op is _U:
                new = version if version is not None else now + 1
                if last_use.get((stage, pipeline, now), -1) > position:
                    kept.add(now)
                current[key] = new
                held = 1 + len(kept) + len(in_flight)
            elif op is _F and lookahead and keep_predicted:
                in_flight.add((microbatch, piece))
                held = 1 + len(kept) + len(in_flight)
            else:
                held = 1 + len(kept) + len(in_flight) + (1 if lookahead else 0)
                if op is _B or op is _W:  # a split backward's graph lives until its W
                    in_flight.difference_update([k for k in in_flight if k[0] == microbatch])
            if held > peak[stage]:
                peak[stage] = held
    return peak


def weight_copies(schedule: Schedule, *, keep_predicted: bool = False) -> list[int]:
    """Per stage: weight sets held besides the live parameters (module docstring)."""
    present = _present_if_updates_last(schedule)
    if present is not None:  # a flush: no copies, whatever the version tags say
        return [0 if s in present else -1 for s in range(schedule.num_stages)]
    versions = weight_versions(schedule, keep_predicted=keep_predicted)
    stashing = _stashes_live(schedule)
    return [v - 1 + (1 if s in stashing else 0) for s, v in enumerate(versions)]


def _stashes_live(schedule: Schedule) -> set[int]:
    """The stages where some forward runs at the live version and an update of the stage
    comes before its backward (so the runtime copies the live weights for it)."""
    found: set[int] = set()
    for program in schedule.programs:
        live: dict[tuple[int, int], int] = {}
        # per (stage, pipeline): (micro-batch, piece) -> ran at the live version; and the
        # forwards an update has passed since
        pending: dict[tuple[int, int], dict[tuple[int | None, int], bool]] = {}
        passed: dict[tuple[int, int], set[tuple[int | None, int]]] = {}
        for op, stage, microbatch, piece, version, lookahead, pipeline in program:
            where = (stage, pipeline)
            now = live.setdefault(where, 0)
            waiting = pending.setdefault(where, {})
            if op is Op.STEP:
                live[where] = version if version is not None else now + 1
                passed[where] = set(waiting)
            elif op is Op.FORWARD and not lookahead:
                waiting[(microbatch, piece)] = version is None or version == now
            elif op in GRADIENT_OPS:
                for key in [k for k in ((microbatch, 0), (microbatch, 1), (microbatch, 2))
                            if k in waiting]:
                    if waiting.pop(key) and key in passed.get(where, ()):
                        found.add(stage)
    return found


def _present_if_updates_last(schedule: Schedule) -> set[int] | None:
    """The stages that run a compute action or an update, when no compute action of a stage
    (and pipeline) follows an update of it in its rank's program and none runs on predicted
    weights (a flush schedule's one iteration); else None. Then :func:`weight_versions` never
    keeps an old version (one is kept only for a compute action after an update) nor a
    predicted set, so a present stage holds one set, and :func:`_stashes_live` finds no
    backward after an update: :func:`weight_copies` is 0 there (-1 on a stage with no
    action, as the walk gives), in one pass without the walks' sets (the memory model asks
    it once per shape; ``tests/test_weight_copies.py`` compares the two)."""
    present: set[int] = set()
    for program in schedule.programs:
        updated: set[tuple[int, int]] = set()
        for op, stage, _, _, _, lookahead, pipeline in program:
            if op is _U:
                updated.add((stage, pipeline))
            elif op in COMPUTE_OPS:
                if lookahead or (stage, pipeline) in updated:
                    return None
            else:
                continue
            present.add(stage)
    return present
