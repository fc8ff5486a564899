"""Weight versions of one stage, driven by the version tags the schedule put on its actions.

The schedule says which version every forward uses (``F@v``), which every backward must use
(``B@v``) and where updates land (``U@v``); this component makes that true with explicit
tensor sets that modern autograd accepts (no aliasing tricks):

* **live** — the module's own parameters. A forward uses them directly when it is at the
  current version and no update of this stage happens before its backward (every
  synchronous schedule, and PipeDream's last stage).
* **snapshot v** — a detached copy of the weights as they were at version ``v``, leaf tensors
  that require grad. Forwards whose backward comes after an update (weight stashing), and
  forwards at an older version (vertical sync, 2BW, WPipe's G0) run through
  ``torch.func.functional_call`` on the snapshot; their backward differentiates that same
  graph, and the gradients are then added to the live parameters' ``.grad``, where the
  optimizer applies them. A snapshot is taken when its version is still live (at the first
  forward that needs it, or just before the update that replaces it) and dropped after the
  last action that names its version — the program is data, so "last" is known in advance.
* **predicted** (``F@v~s``: PipeOptim, SpecTrain) — ``W - lr*s*ΔW`` from the optimizer's own
  rule (:mod:`pipeweave.runtime.prediction`). By default the forward runs under ``no_grad``
  on the predicted weights and the backward recomputes the stage at the *current* weights
  (``backward="recompute"``): that is the paper's semantics (Algorithm 1 restores the cached
  weights and back-propagates with them) and keeps at most two weight sets alive (live +
  one transient prediction). ``backward="graph"`` instead differentiates the graph built on
  the predicted weights (they approximate the current ones); it saves the second forward
  but keeps one predicted copy per micro-batch in flight. With activation recomputation on
  the stage as well, ``graph`` keeps the predicted copy (not the graph) and the backward
  recomputes on it, so the two options combine to what each says. SpecTrain's backward
  predicts too (``B@v~s``): it recomputes at ``W - lr*s*v`` from the current weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..ir import Action, Op
from .prediction import DirectionTracker
from .semantics_options import BACKWARD_MODES

__all__ = ["StageWeights", "ForwardPlan"]


@dataclass(frozen=True)
class ForwardPlan:
    """How one forward (and its backward) treats the weights."""

    mode: str  # "live" | "snapshot" | "predicted"
    version: int
    lookahead: int
    keep_graph: bool  # False: forward under no_grad, backward recomputes
    keep_weights: bool = False  # predicted: keep the copy for the backward (graph mode)


class StageWeights:
    """Versions of one stage's weights on one rank (see module docstring)."""

    def __init__(self, *, stage: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                 program: Sequence[Action], recompute: bool = False,
                 backward: str = "recompute", spectrain: bool = False,
                 distance: Callable[[Action], int] | None = None, pipeline: int = 0) -> None:
        if backward not in BACKWARD_MODES:
            raise ValueError(f"backward={backward!r}; choose one of {BACKWARD_MODES}")
        self.stage = stage
        self.pipeline = pipeline
        self.module = module
        self.optimizer = optimizer
        self.names = [name for name, _ in module.named_parameters()]
        self.live_params = dict(module.named_parameters())
        self.live_version = 0
        self.snapshots: dict[int, dict[str, Tensor]] = {}
        self.predicted: dict[tuple[int, int], dict[str, Tensor]] = {}
        self.peak_versions = 1
        self.peak_copies = 0
        self.plans: dict[tuple[int, int], ForwardPlan] = {}
        self._last_use: dict[int, int] = {}
        self._expiring: dict[int, list[int]] = {}
        self._distance = distance if distance is not None else (lambda action: action.lookahead)
        self._analyse(program, recompute, backward)
        self.directions: DirectionTracker | None = None
        if spectrain or any(p.mode == "predicted" for p in self.plans.values()):
            self.directions = DirectionTracker(optimizer, self.live_params.items(),
                                               rule="momentum" if spectrain else "optimizer")

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
            elif action.op is Op.BACKWARD and action.microbatch is not None:
                for piece in (0, 1, 2):
                    entry = forwards.get((action.microbatch, piece))
                    if entry is None:
                        continue
                    f_position, forward, live_at_forward = entry
                    version = forward.version if forward.version is not None else live_at_forward
                    updates_between = sum(1 for u in updates_at if u > f_position)
                    lookahead = self._distance(forward)
                    key = (action.microbatch, piece)
                    if lookahead or action.lookahead:
                        graph = backward == "graph" and not action.lookahead
                        self.plans[key] = ForwardPlan("predicted", version, lookahead,
                                                      graph and not recompute, graph)
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

    def forward_params(self, action: Action, plan: ForwardPlan) -> Mapping[str, Tensor] | None:
        """Tensors the forward runs on (None: the live module)."""
        if plan.mode == "live":
            return None
        if plan.mode == "snapshot":
            return self._snapshot(plan.version)
        params = self._predict(plan.lookahead)
        if plan.keep_weights:
            for tensor in params.values():
                tensor.requires_grad_(True)
            assert action.microbatch is not None
            self.predicted[(action.microbatch, action.piece)] = params
            self._count()
        else:
            self._count(transient=1)
        return params

    def _snapshot(self, version: int) -> dict[str, Tensor]:
        if version not in self.snapshots:
            if version != self.live_version:
                raise RuntimeError(
                    f"stage {self.stage}: version {version} is needed but was not kept "
                    f"(live version is {self.live_version}); the schedule's version tags are "
                    f"inconsistent with its updates"
                )
            self.snapshots[version] = {
                name: p.detach().clone().requires_grad_(True) for name, p in self.live_params.items()
            }
            self._count()
        return self.snapshots[version]

    def _count(self, transient: int = 0) -> None:
        """Track the peak number of distinct weight sets held (live, snapshots, predictions)."""
        held = len(set(self.snapshots) | {self.live_version}) + len(self.predicted) + transient
        self.peak_versions = max(self.peak_versions, held)
        self.peak_copies = max(self.peak_copies, len(self.snapshots) + len(self.predicted) + transient)

    # -- backward ---------------------------------------------------------------------------
    def recompute_params(self, action: Action, piece: int) -> Mapping[str, Tensor] | None:
        """Weights a backward recomputes its forward with (None: the live module)."""
        assert action.microbatch is not None
        plan = self.plans.get((action.microbatch, piece))
        if plan is None or plan.mode == "live":
            return None
        if plan.mode == "snapshot":
            return self.snapshots[plan.version]
        if action.lookahead:  # SpecTrain: predict at backward time too
            params = self._predict(action.lookahead)
            for tensor in params.values():
                tensor.requires_grad_(True)
            self.predicted[(action.microbatch, piece)] = params
            self._count()
            return params
        stored = self.predicted.get((action.microbatch, piece))
        return stored  # graph mode with activation recomputation, else None = current weights

    def _predict(self, steps: int) -> dict[str, Tensor]:
        assert self.directions is not None, "a predicted forward on a stage without a tracker"
        return self.directions.predict(steps)

    def after_backward(self, action: Action, position: int) -> None:
        """Move gradients from snapshot/predicted tensors into the live parameters."""
        assert action.microbatch is not None
        sources: list[Mapping[str, Tensor]] = []
        for piece in (0, 1, 2):
            plan = self.plans.get((action.microbatch, piece))
            if plan is None:
                continue
            if plan.mode == "snapshot":
                sources.append(self.snapshots[plan.version])
            predicted = self.predicted.pop((action.microbatch, piece), None)
            if predicted is not None:
                sources.append(predicted)
        seen: set[int] = set()
        for source in sources:
            if id(source) in seen:
                continue
            seen.add(id(source))
            self._transfer(source)
        for version in self._expiring.pop(position, ()):
            self.snapshots.pop(version, None)

    def _transfer(self, source: Mapping[str, Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in source.items():
                if tensor.grad is None:
                    continue
                live = self.live_params[name]
                if live.grad is None:
                    live.grad = tensor.grad.clone()
                else:
                    live.grad += tensor.grad
                tensor.grad = None

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
