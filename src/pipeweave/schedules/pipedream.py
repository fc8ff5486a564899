"""PipeDream: asynchronous 1F1B(-RR) without flush, an update after every backward, weight stashing.

pipedream.txt §3.2–3.3. The input stage admits NOAM = ceil(#workers / #input-stage replicas)
micro-batches, then every stage alternates one backward and one forward; each backward is
followed by the stage's optimizer step (update period 1). Each forward uses the latest version
on its stage and stashes it; its backward uses the same version (weight stashing), so stage
``s`` of a straight pipeline holds ``P - s`` versions at its peak. P=3, M=2, K=2, as
``{op}{micro-batch}@{version}`` (``U@v`` produces version ``v``)::

    rank0  F0@0 F1@0 F2@0 B0@0 U@1 F3@1 B1@0 U@2 B2@0 U@3 B3@1 U@4
    rank1       F0@0 F1@0 B0@0 U@1 F2@1 B1@0 U@2 F3@2 B2@1 U@3 B3@2 U@4
    rank2            F0@0 B0@0 U@1 F1@1 B1@1 U@2 F2@2 B2@2 U@3 F3@3 B3@3 U@4

Option ``vertical_sync=True`` (pipedream.txt §3.3): every stage runs micro-batch ``j``'s
forward and backward at the version stage 0 used for ``j``, so the update reads
``w(t+1) = w(t) - lr * grad f(w_1(t-n+1), ..., w_n(t-n+1))``. Version numbers must mean the
same on every stage for that, so every stage needs the same replica count.

Replicated stages (``Shape.replicas``; 1F1B-RR): micro-batch ``j`` on replica ``j % r_s``, each
replica with its own warm-up depth, an all-reduce before every update; replicas synchronise
once per round of ``r_s`` micro-batches (see :mod:`pipeweave.schedules.async_common`).
``replicas=(2, 1)``, M=4: three workers, so each input replica admits NOAM = ceil(3/2) = 2::

    rank0  0F0@0 0F2@0 0B0@0 0AR@1 0U@1 0B2@0 0AR@2 0U@2          (even micro-batches)
    rank1  0F1@0 0F3@0 0B1@0 0AR@1 0U@1 0B3@0 0AR@2 0U@2          (odd micro-batches)
    rank2  1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Schedule
from .async_common import DRAIN, Counts, Tags, async_layout, build_async
from .corrections import NESTEROV, PIPEMARE, PIPEMARE_T2, WARMUP
from .registry import Shape, register

__all__ = ["pipedream"]


@register("pipedream",
          description="asynchronous 1F1B(-RR) without flush, update after every backward, weight stashing",
          paper="D. Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training, SOSP 2019, §3.2-3.3", synchronous=False,
          options=("vertical_sync", DRAIN, WARMUP, NESTEROV, PIPEMARE, PIPEMARE_T2),
          width=True, replicas=True, checkpointable=True)
def pipedream(shape: Shape) -> Schedule:
    vertical_sync = shape.option("vertical_sync", False)
    if not isinstance(vertical_sync, bool):
        raise ValueError(f"pipedream option vertical_sync must be True or False, got {vertical_sync!r}")
    layout = async_layout("pipedream", shape)
    replicas = sorted({layout.replicas(s) for s in range(layout.num_stages)})
    if vertical_sync and len(replicas) > 1:
        raise ValueError(
            f"pipedream vertical_sync needs every stage to have the same replica count (a version "
            f"number counts rounds of replicas, so it means different things on stages with "
            f"{replicas} replicas); use equal replicas or vertical_sync=False"
        )

    def stashed(stage: int, microbatch: int, counts: Mapping[tuple[int, int], Counts]) -> Tags:
        version = counts[(stage, microbatch)].forward
        return Tags(version, version)

    def synced(stage: int, microbatch: int, counts: Mapping[tuple[int, int], Counts]) -> Tags:
        version = counts[(0, microbatch)].forward
        # The version stage 0 saw is never newer than this stage's latest: stage s runs its
        # forward of j after stage 0's, and has made at least as many updates by then.
        assert version <= counts[(stage, microbatch)].forward, (stage, microbatch)
        return Tags(version, version)

    return build_async("pipedream", shape, layout, period=lambda stage: 1,
                       rule=synced if vertical_sync else stashed)
