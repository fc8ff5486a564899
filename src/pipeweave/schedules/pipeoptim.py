"""PipeOptim and SpecTrain: PipeDream's asynchronous 1F1B with weight prediction instead of stashing.

Both run PipeDream's order (admit ``P - s`` micro-batches, alternate backward/forward, no flush)
with an update after every backward, and keep no stash: a forward runs on weights predicted
``s`` updates ahead, ``W^(t+s) = W(t) - lr * s * dW(t)`` (pipeoptim.txt Eq. 5; ``dW`` from the
optimizer's own rule, Table I), and the backward runs on the weights the stage has by then.

**PipeOptim** (pipeoptim.txt §III, Algorithm 1). The forward of micro-batch ``j`` on stage ``r``
is tagged ``F{j}@{v}~{s}``: version ``v`` is the latest on the stage and ``s`` the number of
updates the stage makes between this forward and its backward; the backward is tagged with the
version it will find, ``v + s`` (the validator proves the count). In steady state
``s = D - r - 1`` (Eq. 4) and the last stage never predicts. P=3, M=2, K=2::

    rank0  F0@0 F1@0~1 F2@0~2 B0@0 U@1 F3@1~2 B1@1 U@2 B2@2 U@3 B3@3 U@4
    rank1       F0@0   F1@0~1 B0@0 U@1 F2@1~1 B1@1 U@2 F3@2~1 B2@2 U@3 B3@3 U@4
    rank2              F0@0   B0@0 U@1 F1@1   B1@1 U@2 F2@2   B2@2 U@3 F3@3 B3@3 U@4

We tag the exact count rather than Eq. 4's constant. The two differ only for a stage's first
``D - r - 1`` forwards, which run at version 0: the optimizer has no state then, ``dW = 0``, and
every prediction is the identity, so numerically the default *is* the paper's rule.

Option ``lookahead=<int>`` (an ablation) fixes the prediction distance instead: every forward on
a stage but the last is tagged ``~k`` whatever the count, and the runtime, the simulator and the
trace read it from the action like any other look-ahead. The prediction is then approximate by
design (``v + k`` need not be the version the backward finds), so the validator checks such a
schedule by the weaker rule that each backward runs at its stage's current weights (see
:mod:`pipeweave.ir.validate`). P=3, M=3, K=1, ``lookahead=2``::

    rank0  F0@0~2 F1@0~2 F2@0~2 B0@0 U@1        B1@1 U@2        B2@2 U@3
    rank1         F0@0~2 F1@0~2 B0@0 U@1 F2@1~2 B1@1 U@2        B2@2 U@3
    rank2                F0@0   B0@0 U@1 F1@1   B1@1 U@2 F2@2   B2@2 U@3

**SpecTrain** (Chen et al. 2018, arXiv:1809.02839; pipeoptim.txt §II-C2, §III-B2). It predicts
at the forward *and* at the backward, towards one target per micro-batch: the weights the stage
will have when the micro-batch's backward leaves stage 0 ("the future pipeline unit"). With F
and B of equal length a stage makes one update every two units and a gradient needs one unit per
stage to travel back, so from stage ``r`` that is ``floor(r/2)`` updates after its own backward:

    forward  s_f = (updates between F and B) + floor(r/2)    (= D - r - 1 + floor(r/2) steady)
    backward s_b = floor(r/2)                                   (0 on stage 0)

These are SpecTrain's version differences as its authors' implementation computes them. The
backward is tagged ``B{j}@{v_b}~{s_b}``, ``v_b`` the current version: the runtime must run the
backward on ``W(v_b) - lr * s_b * dW(v_b)``. Both passes target version ``v_f + s_f = v_b + s_b``,
which is what the validator checks (a backward's ``version + lookahead`` equals its forward's).
Unlike PipeOptim, SpecTrain's last stage predicts too (``floor((D-1)/2)``, both passes).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Schedule
from .async_common import DRAIN, Counts, Tags, async_layout, build_async
from .corrections import WARMUP
from .registry import Shape, register

__all__ = ["pipeoptim", "spectrain", "spectrain_backward_distance"]


@register("pipeoptim",
          description="asynchronous 1F1B, update after every backward, forward on weights predicted "
                      "s = D-rank-1 updates ahead, no stashing",
          paper="L. Guan et al., PipeOptim: Ensuring Effective 1F1B Schedule with Optimizer-Dependent Weight Prediction, arXiv:2312.00839 (2023), §III, Algorithm 1", synchronous=False,
          options=("lookahead", DRAIN, WARMUP),
          cost="every stage but the last runs its forward twice per micro-batch: the backward "
               "recomputes it at the current weights (the paper's rule), about 1/3 more compute "
               "at B = 2F; --prediction-backward graph skips that and keeps one predicted weight "
               "copy per micro-batch in flight",
          width=True, replicas=True, semantics=("backward",), prediction="optimizer",
          checkpointable=True)
def pipeoptim(shape: Shape) -> Schedule:
    override = shape.option("lookahead", None)
    if override is not None and (isinstance(override, bool) or not isinstance(override, int)
                                 or override < 0):
        raise ValueError(
            f"pipeoptim option lookahead must be an integer >= 0 (updates to predict ahead on every "
            f"stage but the last), got {override!r}; leave it out for the exact count per forward"
        )
    layout = async_layout("pipeoptim", shape)
    last = layout.num_stages - 1

    def predicted(stage: int, microbatch: int, counts: Mapping[tuple[int, int], Counts]) -> Tags:
        c = counts[(stage, microbatch)]
        ahead = c.between if override is None or stage == last else override
        return Tags(c.forward, c.backward, forward_lookahead=ahead)

    return build_async("pipeoptim", shape, layout, period=lambda stage: 1, rule=predicted)


def spectrain_backward_distance(stage: int) -> int:
    """SpecTrain's backward version difference on ``stage``: ``floor(stage / 2)`` (module docstring)."""
    return stage // 2


@register("spectrain",
          description="asynchronous 1F1B, update after every backward, forward and backward on "
                      "SGDM-predicted weights (SpecTrain)",
          paper="C.-C. Chen et al., Efficient and Robust Parallel DNN Training through Model "
                "Parallelism on Multi-GPU Platform (SpecTrain), arXiv:1809.02839 (2018)",
          synchronous=False, default_optimizer=("sgd", {"momentum": 0.9}), options=(DRAIN,),
          cost="every stage but the last runs its forward twice per micro-batch: the backward "
               "recomputes it at the weights predicted for the backward",
          prediction="momentum", checkpointable=True)
def spectrain(shape: Shape) -> Schedule:
    if shape.replicas is not None or shape.width != 1:
        raise ValueError(
            f"spectrain's version differences are derived for a straight pipeline; got replicas="
            f"{shape.replicas} width={shape.width}; use a straight pipeline (or 'pipeoptim', "
            "whose exact counts also cover replicated stages)"
        )
    layout = async_layout("spectrain", shape)

    def predicted(stage: int, microbatch: int, counts: Mapping[tuple[int, int], Counts]) -> Tags:
        c = counts[(stage, microbatch)]
        back = spectrain_backward_distance(stage)
        return Tags(c.forward, c.backward, forward_lookahead=c.between + back,
                    backward_lookahead=back)

    return build_async("spectrain", shape, layout, period=lambda stage: 1, rule=predicted)

