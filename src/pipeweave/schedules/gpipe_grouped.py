"""GPipe grouping (wpipe.txt appendix A.4, Fig. 15): GPipe on ``v`` groups of chunks per rank.

WPipe's grouping applied to GPipe: the ``P`` model partitions are each cut again, into ``vP``
stages in ``v`` groups on the same ``P`` ranks (:meth:`Layout.chunked`; the paper draws
``v = 2``, "two model partitions further divided into four and divided into two groups")::

    G0 = stages 0 .. P-1     on ranks 0 .. P-1      (first 1/v of the model)
    G1 = stages P .. 2P-1    on ranks 0 .. P-1
    ...

Each rank runs GPipe's order group after group: every forward of ``G0``, then every forward
of ``G1``, ..., then every backward of the last group, ..., then every backward of ``G0``,
each group's micro-batches in order; a flush and one update per iteration, so it trains like
``gpipe`` (one weight version, gradients of all ``M`` micro-batches summed).

Why the bubble shrinks: a chunk costs ``1/v`` of a partition, and the pipeline fills and drains
once per phase (forward, backward) at chunk speed, not once per group: while rank ``r`` runs
``G1``'s forwards the later ranks are still busy with ``G0``'s. With ``M >= P`` no rank ever
waits inside a phase (``G(g+1)``'s first micro-batch reaches rank 0 after ``P`` chunk forwards,
when rank 0 has done its ``M >= P`` forwards of ``G(g)``), so with chunk costs ``f`` and ``b``
the iteration takes::

    (vM + P - 1) (f + b)          bubble fraction  (P - 1) / (vM + P - 1)

against GPipe's ``(M + P - 1)(F + B)`` with ``F = vf``, ``B = vb``: the same work and a bubble
of ``(P - 1)(F + B) / v``, half of GPipe's for the paper's two groups. In general (``M < P``
too) each phase takes ``(v - 1) max(M, P) + M + P - 1`` chunk passes. The price
(appendix A.4): ``v`` times the point-to-point messages (every boundary between consecutive
stages crosses ranks, ``v P - 1`` of them), which NVLink makes cheap. Activations: a rank
keeps all ``M`` micro-batches of each of its ``v`` chunks, ``M`` partitions' worth, as GPipe.

P=2, v=2, M=2 (stages 0, 2 on rank 0 and 1, 3 on rank 1), unit-cost timeline (``f = b = 1``):
10 steps ``= (2*2 + 2 - 1) * 2``, each rank idle 2. GPipe on the same model (a partition's
pass costs 2) takes ``(2 + 2 - 1) * 4 = 12``, each rank idle 4::

    rank0  0F0 0F1 2F0 2F1 .   .   2B0 2B1 0B0 0B1
    rank1  .   1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1 .

With ``chunks=1`` it is plain ``gpipe``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Layout, Op, Schedule
from .common import routed, update_actions
from .registry import Shape, register

__all__ = ["gpipe_grouped", "grouped_order"]


def grouped_order(layout: Layout, rank: int, microbatches: Sequence[int]
                  ) -> list[tuple[Op, int, int]]:
    """Rank ``rank``'s passes of one iteration: ``(op, stage, micro-batch)``.

    Forwards group by group (stages in ascending order), then backwards from the last group
    back to the first; in every group the micro-batches ``layout`` routes to ``rank`` in order.
    """
    stages = layout.stages_of(rank)
    order = [(Op.FORWARD, s, j) for s in stages for j in routed(layout, s, rank, microbatches)]
    order += [(Op.BACKWARD, s, j) for s in reversed(stages)
              for j in routed(layout, s, rank, microbatches)]
    return order


@register("gpipe-grouped",
          description="GPipe grouping: v chunks per rank in groups, all forwards group by group, "
                      "then all backwards; bubble (P-1)/(vM+P-1), half GPipe's at v=2",
          paper="P. Yang et al., Group-based Interleaved Pipeline Parallelism for Large-scale "
                "DNN Training (WPipe), ICLR 2022, appendix A.4, Fig. 15",
          synchronous=True, default_chunks=2,
          width=True, replicas=True, chunks=None)
def gpipe_grouped(shape: Shape) -> Schedule:
    if shape.pipelines != 1:
        raise ValueError(f"gpipe-grouped runs one pipeline, got pipelines={shape.pipelines}; "
                         "set it to 1")
    layout = shape.layout()
    M = shape.microbatches
    programs: list[list[Action]] = []
    for rank in range(layout.num_ranks):
        program: list[Action] = []
        for k in range(shape.iterations):
            for op, stage, j in grouped_order(layout, rank, range(k * M, (k + 1) * M)):
                program.append(Action(op, stage, j, version=k))
            for stage in layout.stages_of(rank):
                program.extend(update_actions(layout, stage, k + 1))
        programs.append(program)
    return Schedule(
        name="gpipe-grouped", layout=layout, microbatches=M, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=True, options=dict(shape.options),
    )
