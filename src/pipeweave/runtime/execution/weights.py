"""Weight versions of one stage, driven by the version tags the schedule put on its actions.

The schedule says which version every forward uses (``F@v``), which every backward must use
(``B@v``) and where updates land (``U@v``); this component makes that true with explicit
tensor sets that modern autograd accepts (no aliasing tricks), each version other than the
live one held in a preallocated replica of the stage module (:mod:`.replicas`):

* **live** — the module's own parameters. A forward uses them directly when it is at the
  current version and no update of this stage happens before its backward (every
  synchronous schedule, and PipeDream's last stage).
* **snapshot v** — a replica whose parameters hold the weights as they were at version
  ``v``. Forwards whose backward comes after an update (weight stashing), and forwards at an
  older version (vertical sync, 2BW, WPipe's G0) call the replica; their backward
  differentiates that same graph, and the gradients are then moved to the live parameters'
  ``.grad``, where the optimizer applies them. A snapshot is taken (one foreach copy into a
  free replica) when its version is still live (at the first forward that needs it, or just
  before the update that replaces it) and its replica goes back to the pool after the last
  action that names its version — the program is data, so "last" is known in advance.
* **predicted** (``F@v~s``: PipeOptim, SpecTrain) — ``W - lr*s*ΔW`` from the optimizer's own
  rule (:mod:`pipeweave.runtime.execution.prediction`), written in one pass into a replica. By default the forward runs under ``no_grad``
  on the predicted weights and the backward recomputes the stage at the *current* weights
  (``backward="recompute"``): that is the paper's semantics (Algorithm 1 restores the cached
  weights and back-propagates with them) and keeps at most two weight sets alive (live +
  one transient prediction, always the same replica). ``backward="graph"`` instead differentiates the graph built on
  the predicted weights (they approximate the current ones); it saves the second forward
  but keeps one predicted copy per micro-batch in flight. With activation recomputation on
  the stage as well, ``graph`` keeps the predicted copy (not the graph) and the backward
  recomputes on it, so the two options combine to what each says. SpecTrain's backward
  predicts too (``B@v~s``): it recomputes at ``W - lr*s*v`` from the current weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...ir import GRADIENT_OPS, Action, Op
from .prediction import RULES, DirectionTracker
from .replicas import Replica, ReplicaPool
from ...planner.semantics_options import BACKWARD_MODES

__all__ = ["StageWeights", "ForwardPlan", "VersionRules"]


@dataclass(frozen=True)
class ForwardPlan:
    """How one forward (and its backward) treats the weights."""

    mode: str  # "live" | "snapshot" | "predicted"
    version: int
    lookahead: int
    keep_graph: bool  # False: forward under no_grad, backward recomputes
    keep_weights: bool = False  # predicted: keep the copy for the backward (graph mode)


@dataclass(frozen=True)
class VersionRules:
    """How a stage's weight versions are used (the plan's and the schedule's settings)."""

    recompute: bool = False
    """The stage recomputes its forward in the backward (it keeps no activations)."""
    backward: str = "recompute"
    """PipeOptim's backward: ``"recompute"`` at the current weights or ``"graph"`` at the
    forward's predicted ones (:data:`BACKWARD_MODES`)."""
    prediction: str | None = None
    """The schedule's prediction rule (``ScheduleInfo.prediction``): ``"optimizer"``,
    ``"momentum"`` (SpecTrain) or None."""


class StageWeights:
    """Versions of one stage's weights on one rank (see module docstring)."""

    def __init__(self, *, stage: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                 program: Sequence[Action], rules: VersionRules = VersionRules(),
                 pipeline: int = 0) -> None:
        recompute, backward, prediction = rules.recompute, rules.backward, rules.prediction
        if backward not in BACKWARD_MODES:
            raise ValueError(f"backward={backward!r}; choose one of {BACKWARD_MODES}")
        self.stage = stage
        self.pipeline = pipeline
        self.module = module
        self.optimizer = optimizer
        self.replicas = ReplicaPool(module)
        self.live_version = 0
        self.snapshots: dict[int, Replica] = {}
        self.predicted: dict[tuple[int, int], Replica] = {}
        self._scratch: Replica | None = None  # the transient prediction's replica
        self.peak_versions = 1
        self.peak_copies = 0
        self.prediction_seconds = 0.0
        """Time spent writing predicted weights (inside the forwards and backwards)."""
        self.plans: dict[tuple[int, int], ForwardPlan] = {}
        self._last_use: dict[int, int] = {}
        self._expiring: dict[int, list[int]] = {}
        self._analyse(program, recompute, backward)
        self.directions: DirectionTracker | None = None
        # SpecTrain's rule predicts on every stage, forwards and backwards; the optimizer's
        # rule only where the program marks a forward predicted (not on the last stage).
        rule = prediction or "optimizer"
        if rule not in RULES:
            raise ValueError(f"prediction={prediction!r}; choose one of {RULES} or None")
        if rule == "momentum" or any(p.mode == "predicted" for p in self.plans.values()):
            self.directions = DirectionTracker(optimizer, module.named_parameters(), rule=rule)

    # -- analysis of the program (done once) ------------------------------------------------
    def _analyse(self, program: Sequence[Action], recompute: bool, backward: str) -> None:
        live = 0
        forwards: dict[tuple[int, int], tuple[int, Action, int]] = {}
        updates_at: list[int] = []
        for position, action in enumerate(program):
            if action.stage != self.stage or action.pipeline != self.pipeline:
                continue
            if action.op is Op.STEP:
                live += 1
                updates_at.append(position)
            elif action.op is Op.FORWARD and action.microbatch is not None:
                forwards[(action.microbatch, action.piece)] = (position, action, live)
            elif action.op is Op.BACKWARD_WEIGHT and action.microbatch is not None:
                for piece in (0, 1, 2):  # the W finishes what its I began: the last use
                    plan = self.plans.get((action.microbatch, piece))
                    if plan is not None and plan.mode == "snapshot":
                        self._last_use[plan.version] = max(self._last_use[plan.version], position)
            elif action.op in GRADIENT_OPS and action.microbatch is not None:
                for piece in (0, 1, 2):
                    entry = forwards.get((action.microbatch, piece))
                    if entry is None:
                        continue
                    f_position, forward, live_at_forward = entry
                    version = forward.version if forward.version is not None else live_at_forward
                    updates_between = sum(1 for u in updates_at if u > f_position)
                    lookahead = forward.lookahead
                    key = (action.microbatch, piece)
                    if lookahead or action.lookahead:
                        graph = backward == "graph" and not action.lookahead
                        self.plans[key] = ForwardPlan("predicted", version, lookahead,
                                                      graph and not recompute, graph)
                    elif (backward == "recompute" and action.version is not None
                          and action.version > version):
                        # a backward on newer weights than its forward's without a prediction
                        # (PipeOptim with lookahead=0): the paper's rule, recomputed at the
                        # current weights, so nothing of the forward's version is kept
                        self.plans[key] = ForwardPlan("live", version, 0, False)
                    elif version == live_at_forward and updates_between == 0:
                        self.plans[key] = ForwardPlan("live", version, lookahead, not recompute)
                    else:
                        self.plans[key] = ForwardPlan("snapshot", version, lookahead, not recompute)
                        self._last_use[version] = max(self._last_use.get(version, -1), position)
        for version, position in self._last_use.items():
            self._expiring.setdefault(position, []).append(version)

    # -- forward ----------------------------------------------------------------------------
    def forward_plan(self, action: Action) -> ForwardPlan:
        assert action.microbatch is not None
        return self.plans.get((action.microbatch, action.piece),
                              ForwardPlan("live", self.live_version, 0, True))

    def forward_module(self, action: Action, plan: ForwardPlan) -> nn.Module | None:
        """The replica the forward runs (None: the live module)."""
        if plan.mode == "live":
            return None
        if plan.mode == "snapshot":
            return self._snapshot(plan.version).module
        if plan.keep_weights:
            assert action.microbatch is not None
            replica = self._predict(plan.lookahead, self.replicas.acquire())
            self.predicted[(action.microbatch, action.piece)] = replica
            self._count()
            return replica.module
        if self._scratch is None:
            self._scratch = self.replicas.acquire()
        self._count(transient=1)
        return self._predict(plan.lookahead, self._scratch).module

    def _snapshot(self, version: int) -> Replica:
        if version not in self.snapshots:
            if version != self.live_version:
                raise RuntimeError(
                    f"stage {self.stage}: version {version} is needed but was not kept "
                    f"(live version is {self.live_version}); the schedule's version tags are "
                    f"inconsistent with its updates"
                )
            self.snapshots[version] = self.replicas.take_live()
            self._count()
        return self.snapshots[version]

    def _count(self, transient: int = 0) -> None:
        """Track the peak number of distinct weight sets held (live, snapshots, predictions)."""
        held = len(set(self.snapshots) | {self.live_version}) + len(self.predicted) + transient
        self.peak_versions = max(self.peak_versions, held)
        self.peak_copies = max(self.peak_copies, len(self.snapshots) + len(self.predicted) + transient)

    # -- backward ---------------------------------------------------------------------------
    def recompute_module(self, action: Action, piece: int) -> nn.Module | None:
        """The module a backward recomputes its forward with (None: the live module)."""
        assert action.microbatch is not None
        plan = self.plans.get((action.microbatch, piece))
        if plan is None or plan.mode == "live":
            return None
        if plan.mode == "snapshot":
            return self.snapshots[plan.version].module
        if action.lookahead:  # SpecTrain: predict at backward time too
            replica = self._predict(action.lookahead, self.replicas.acquire())
            self.predicted[(action.microbatch, piece)] = replica
            self._count()
            return replica.module
        stored = self.predicted.get((action.microbatch, piece))
        # graph mode with activation recomputation: the kept prediction; else the current weights
        return None if stored is None else stored.module

    def _predict(self, steps: int, replica: Replica) -> Replica:
        assert self.directions is not None, "a predicted forward on a stage without a tracker"
        began = time.perf_counter()
        self.directions.predict_into(steps, replica.named(self.replicas.names))
        self.prediction_seconds += time.perf_counter() - began
        return replica

    def after_backward(self, action: Action, position: int) -> None:
        """Move gradients from snapshot/predicted replicas into the live parameters."""
        assert action.microbatch is not None
        moved: set[int] = set()
        for piece in (0, 1, 2):
            plan = self.plans.get((action.microbatch, piece))
            if plan is None:
                continue
            if plan.mode == "snapshot":
                replica = self.snapshots[plan.version]
                if id(replica) not in moved:
                    moved.add(id(replica))
                    self.replicas.move_grads(replica)
            predicted = self.predicted.pop((action.microbatch, piece), None)
            if predicted is not None:
                self.replicas.move_grads(predicted)
                self.replicas.release(predicted)
        for version in self._expiring.pop(position, ()):
            expired = self.snapshots.pop(version, None)
            if expired is not None:
                self.replicas.release(expired)

    # -- update -----------------------------------------------------------------------------
    def before_step(self, position: int) -> None:
        """Keep the outgoing version if a later action still names it; remember gradients."""
        version = self.live_version
        if self._last_use.get(version, -1) > position and version not in self.snapshots:
            self._snapshot(version)
        if self.directions is not None:
            self.directions.before_step()

    def after_step(self) -> None:
        self.live_version += 1
        if self.directions is not None:
            self.directions.after_step()
        self._count()
