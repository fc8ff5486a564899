"""V-shape schedules: two chunks per rank placed as a V, and the program assembly they share.

With ``P`` ranks the model is cut into ``2P`` stages and rank ``r`` holds stages ``r`` and
``2P - 1 - r`` (:meth:`Layout.v_shape`, placement ``"v"``). A micro-batch goes down the ranks
on its first chunk and back up on its second, and its backward retraces the V::

    P=3   stage  0 1 2 3 4 5          forward   r0 -> r1 -> r2 => r2 -> r1 -> r0 (loss)
          rank   0 1 2 2 1 0          backward  r0 -> r1 -> r2 => r2 -> r1 -> r0

Both stages at the bottom of the V (``P-1`` and ``P``) are on rank ``P-1``, so that boundary
sends nothing; the loss is computed on rank 0. The generators (:mod:`.zbv`, :mod:`.v_blocks`)
split every backward into ``I`` and ``W`` and order one iteration's passes for every rank of
one pipeline copy; :func:`v_schedule` repeats that order per iteration and per data-parallel
copy, numbers micro-batches and versions, and ends every iteration with the updates of both of
a rank's stages (synchronous: every ``W`` of an iteration before its update).

Memory is counted in *chunk activations*: what one micro-batch leaves on one chunk between its
forward and its weight gradient ``W`` (its ``B`` when a backward is not split). A chunk is half
a stage of the ``P``-stage pipeline (``2P`` chunks for the same model), so two chunk
activations are one *stage unit*, the unit in which 1F1B holds ``P`` on its first rank and in
which the papers count ("activation memory by micro-batch").
"""

from __future__ import annotations

from ..ir import Schedule
from .common import CopyOrder, Pass, copies_schedule, flush_schedule, one_f_one_b_order
from .registry import Shape

__all__ = ["Pass", "VOrder", "v_schedule"]

VOrder = CopyOrder
"""``order(P, M)``: for each rank ``r = 0 .. P-1`` of one pipeline copy, its passes of one
iteration of ``M`` micro-batches, in program order (``F``, ``I`` and ``W`` of stages ``r`` and
``2P - 1 - r``)."""


def v_schedule(name: str, shape: Shape, order: VOrder) -> Schedule:
    """The schedule ``name`` for ``shape``: ``order`` per iteration and copy, then the updates.

    With ``chunks=1`` there is no V: the schedule is plain ``1f1b`` (as ``interleaved-1f1b``
    is with one chunk).
    """
    if shape.chunks == 1:
        return flush_schedule(name, shape, one_f_one_b_order)
    _check(name, shape)
    return copies_schedule(name, shape, shape.layout("v"), order)


def _check(name: str, shape: Shape) -> None:
    if shape.replicas is not None:
        raise ValueError(f"{name} does not support per-stage replicas; use width for data "
                         "parallelism")
    if shape.chunks != 2:
        raise ValueError(f"{name} places exactly two chunks on every rank (a V: rank r holds "
                         f"stages r and 2P-1-r), got chunks={shape.chunks}; use chunks=2 (or "
                         f"chunks=1 for plain 1f1b)")
