"""What a Slicer half costs: a stage's costs under the profile at half the micro-batch.

AutoPipe's Slicer (``sliced-1f1b``, autopipe.txt §III-C) forwards its first micro-batches in
two halves and back-propagates each half on its own (:mod:`pipeweave.sim.halves`). A half of
``m`` samples does not cost half of ``m``'s time on a real device: every call pays a fixed
cost (kernel launches, Python, autograd), and at millisecond actions that cost dominates (cnn
at 2 ranks, 2026-11-27: the two halves together took 2.2-2.6x the whole micro-batch). So a
half's costs are the same costs as the whole's (:func:`~pipeweave.planner.evaluate.plan_costs`
with the runtime's per-action and per-message costs, recomputation, APC, as the caller's
``costs_at`` gives them) of the profile at ``ceil(m / 2)`` samples (the larger of
``tensor_split``'s two pieces), each at least half the whole's::

    half_forward[s]      = max(F_s(ceil(m/2)), F_s(m) / 2)
    half_backward[s]     = max(B_s(ceil(m/2)) - once_s / 2, B_s(m) / 2)
    half_weight_grad[s]  = min(W_s(ceil(m/2)), half_backward[s])

A half's forward is an action of its own and pays every fixed cost; the backward of a sliced
micro-batch is one action that runs autograd once per half, so the simulator's ``2
half_backward`` keeps the runtime's fixed costs of that action (``once_s``: the per-action
cost, posting its send, the action overhead, a sharded stage's gathers; the stage's backward
under the profile with no compute and no bytes) once, not twice.

The floor keeps ``pipeweave auto``'s lower bounds true (:mod:`pipeweave.auto.bounds` prices a
half at half the whole); a profile whose line is steeper than proportional between ``m/2`` and
``m`` would otherwise give a half below it. :func:`halves_at` is the one rule ``pipeweave
auto`` (:mod:`pipeweave.auto.half_costs`), ``pipeweave simulate`` and the planner's Slicer
(:func:`pipeweave.planner.make_plan`, Algorithm 2's ``k``) price a half by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..profiler import Profile
from ..sim import Costs

__all__ = ["halves_at"]

_FIXED: dict[int, tuple[Profile, Profile]] = {}
""":func:`_fixed_only` by id of the profile it empties, with that profile (a search asks it
of the same half-size profile for every sliced candidate: 7 s of 95 at planning scale)."""


def halves_at(costs: Costs, stages: int, profile: Profile,
              costs_at: Callable[[Profile], Costs]) -> Costs:
    """``costs`` (of ``stages`` stages) with the half costs of ``profile``, the profile at a
    half micro-batch (module docstring); ``costs_at``: the same costs under another profile."""
    whole = costs.resolve(stages)
    half = costs_at(profile).resolve(stages)
    once = costs_at(_fixed_only(profile)).resolve(stages).backward
    forward = tuple(max(h, f / 2) for h, f in zip(half.forward, whole.forward))
    backward = tuple(max(h - o / 2, b / 2) for h, o, b in zip(half.backward, once,
                                                               whole.backward))
    weight = tuple(min(w, b) for w, b in zip(half.weight_grad, backward))
    return replace(costs, half_forward=forward, half_backward=backward,
                   half_weight_grad=weight)


def _fixed_only(profile: Profile) -> Profile:
    """``profile`` with no compute and no bytes on the wire: what its costs still hold is
    the runtime's fixed cost of each action (and a sharded stage's gathers). Cached per
    profile object."""
    hit = _FIXED.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    blocks = tuple(replace(b, forward=0.0, backward=0.0, input_grad=0.0, weight_grad=0.0,
                           output_bytes=0.0) for b in profile.blocks)
    fixed = replace(profile, blocks=blocks, input_bytes=0.0)
    if len(_FIXED) > 16:
        _FIXED.clear()
    _FIXED[id(profile)] = (profile, fixed)
    return fixed
