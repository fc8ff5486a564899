"""A global gradient check across the stages, before or after each update (Qi et al., Zero
Bubble Pipeline Parallelism, ICLR 2024, §4 "bypassing optimizer synchronizations").

Global gradient-norm clipping and the NaN/Inf check of mixed precision need every stage's
gradients before any stage may step: a synchronisation across the pipeline at every update,
which puts a flush back into a schedule whose iterations otherwise tile (``zb-h2``). The
check is a chain: ``C`` on stage ``s`` adds the stage's squared gradient norm and NaN flag to
the partial state of stages ``0..s-1`` and passes it on; the last stage holds the complete
state and ``V`` passes it back up, every stage validating its update on the way
(:mod:`pipeweave.ir.deps`). Where ``V`` sits is the whole difference:

**before** the update (``post=False``, a flush)::

    stage s   ... W W  C(s)  V(s)  U(s)  F F F I ...      U waits for the round trip

**after** it (``post=True``, the paper's post-validation)::

    stage s   ... W W  C(s)  U(s)  F F F  V(s)  I ...     U trusts the partial state

With post-validation a stage steps *optimistically* on the partial state (it skips the step
when the partial state already needs clipping or holds a NaN, since the complete one then
does too), and runs the next iteration's leading forwards — its warm-up, up to its first
backward — before the complete state comes back. At ``V`` the runtime keeps the step when
the complete state needs nothing; otherwise every stage undoes its step (restores the
parameters and optimizer state captured before it), redoes it on the clipped gradients, or
skips it on a NaN, and then runs the iteration again from its first forward: the forwards
that ran on the undone weights are discarded with everything they sent, so the result is
exactly the flushed schedule's (as the paper's implementation does; appendix C keeps the
synchronous semantics). In the common case, where nothing is clipped, nothing is redone and
the check costs no bubble: the simulator times the programs as written, which is that case.

:func:`with_global_check` adds the check to a flush schedule (every iteration ends with each
stage's update); a straight pipeline only (one rank per stage: the chain visits each stage
once per update).
"""

from __future__ import annotations

from ..ir import Action, Op, Schedule

__all__ = ["with_global_check"]


def with_global_check(schedule: Schedule, *, post: bool, drain: int | None = None) -> Schedule:
    """``schedule`` with ``C(s)@v`` before every update ``U(s)@v`` and ``V(s)@v`` right after
    that ``C`` (``post=False``) or after the leading forwards of iteration ``v`` on the stage's
    rank (``post=True``; after the last update, at the end of the program). ``drain=N`` with
    ``post=True``: every ``N``-th update is checked before it as with ``post=False``, so no
    rank starts iteration ``v`` before update ``v`` is final there (where checkpoints go)."""
    layout = schedule.layout
    if any(len(ranks) != 1 for ranks in layout.stage_ranks) or schedule.num_stages != schedule.num_ranks:
        raise ValueError(f"a global check before each update runs down the stages and back, one "
                         f"rank per stage; schedule {schedule.name!r} has layout "
                         f"{layout.to_json()}: use width 1, no replicas and one chunk")
    programs = []
    for program in schedule.programs:
        checked: list[Action] = []
        owed: list[Action] = []  # V's waiting for the leading forwards of the next iteration
        for action in program:
            if action.op is Op.STEP:
                check = Action(Op.CHECK, action.stage, version=action.version,
                               pipeline=action.pipeline)
                validate = check.with_(op=Op.VALIDATE)
                checked.append(check)
                drained = drain is not None and action.version is not None and (
                    action.version % drain == 0)
                if post and not drained:
                    owed.append(validate)
                else:
                    checked.append(validate)
            elif owed and action.is_compute and action.op is not Op.FORWARD:
                checked.extend(owed)
                owed = []
            checked.append(action)
        checked.extend(owed)
        programs.append(checked)
    return schedule.with_programs(programs)
