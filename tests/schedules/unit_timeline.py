"""Shared by the schedule tests: a schedule's unit-cost timeline, and activations held."""

from __future__ import annotations

from pipeweave.ir import Action, Op, Schedule, walk


def unit(_rank: int, action: Action) -> float:
    """Every compute action one step, messages free."""
    return 1.0 if action.is_compute else 0.0


def timeline(schedule: Schedule) -> list[str]:
    """Each rank's passes at their unit-cost start steps, ``.`` for an idle step."""
    w = walk(schedule, unit)
    rows = []
    for rank, program in enumerate(schedule.programs):
        cells = {int(w.start[rank][i]): str(a.with_(version=None))
                 for i, a in enumerate(program) if a.is_compute}
        rows.append(" ".join(f"{cells.get(t, '.'):<3}" for t in range(int(w.makespan))).rstrip())
    return rows


def held(program: tuple[Action, ...]) -> int:
    """Peak chunk activations alive on one rank: +1 at an F, -1 at its W (or its B)."""
    alive = peak = 0
    for action in program:
        if action.op is Op.FORWARD:
            alive += 1
        elif action.op in (Op.BACKWARD_WEIGHT, Op.BACKWARD):
            alive -= 1
        peak = max(peak, alive)
    assert alive == 0, "an activation is never released"
    return peak
