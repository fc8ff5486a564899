"""DualPipeV: DeepSeek-V3's DualPipe folded into a V (as torch's ``ScheduleDualPipeV``).

DualPipe (DeepSeek-AI, DeepSeek-V3 Technical Report, 2024, §3.2.1) feeds micro-batches from
both ends of the pipeline at once and pairs, on every rank, the forward of one micro-batch
with the backward of another, so that the communication of one hides behind the computation
of the other. Its V form puts the two directions on one copy of the model: ``2P`` stages in a
V (:mod:`.v_shape`, rank ``r`` holds stage ``r``, chunk 0, on the way down and stage
``2P-1-r``, chunk 1, on the way back up), so the parameters are not duplicated.

Rank ``r`` of ``P`` runs one iteration of ``M >= 2P`` micro-batches in eight phases (the order
torch 2.13 generates; ``F0``/``F1`` a forward of chunk 0/1, ``B`` a whole backward, ``I`` and
``W`` its two halves, ``W*`` the oldest weight gradient still owed, ``[F B]`` a pair)::

    1  2(P-1-r) x  F0                     fill chunk 0
    2  r+1      x  F0 F1                  both chunks
    3  P-1-r    x  I1 W* F1               zero bubble on chunk 1
    4  M-2P+r+1 x  [F0 B1] [F1 B0]        the steady state: every forward paired
    5  P-1-r    x  B1 [F1 B0]
    6  r+1      x  B1 B0                  from the middle on (odd ranks before the B1, even
                                          ranks before the B0), split: I1 I0
    7  P-1-r    x  W* I0                  (B0 if nothing was split in phase 6)
    8  r+1      x  W*                     the weight gradients still owed

Each stage's forwards and backwards go in micro-batch order; ``W*`` takes the oldest owed
``W`` (the order the ``I``'s ran). On rank ``P-1`` the first phase-4 ``F0 B1`` is not
overlapped in torch (both chunks are at the bottom of the V and the ``B1`` feeds the ``B0``);
sequentially that makes no difference, and it makes none here.

**The pair** is expressed as an ``F`` immediately followed by the ``B`` (or ``I``) of another
micro-batch, with no explicit pairing in the IR. What pairing buys in DualPipe is overlap of
one micro-batch's *communication* (the MoE all-to-all, the pipeline's sends) with the other's
*computation* on separate streams; both pipeweave interpreters run a rank's computation in
one stream, and pipeweave's point-to-point sends are already asynchronous and its receives
posted ahead of need. So a pair would carry nothing an interpreter could use — torch's own
runtime, too, runs an ``OVERLAP_F_B``'s two halves one after the other — and adjacency says
all there is to say: the simulator times an ``F``-``B`` pair as ``F + B``, the report's
``F&B``.

**Bubble.** The report's Table 2 gives DualPipe on ``PP`` stages ``(PP/2 - 1)(F&B + B - 3W)``
per device (``F``, ``B``, ``W`` per chunk, ``F&B`` an overlapped forward-backward pair); the
V has ``PP = 2P`` stages on ``P`` ranks, so ``(P-1)(F&B + B - 3W)``. Here a pair runs in one
stream (``F&B = F + B``), and what this order costs is timed exactly by the simulator
(messages free, ``B = I + W``, ``M >= 2P``, ``W <= I <= F``): every rank idles the same

    (P-1) x max(F + I - W, 2(F - W))

whatever ``M``, so an iteration takes ``2M(F + I + W)`` plus that; at ``F = I = W``:
``(P-1)F``, i.e. ``6M + P - 1`` unit steps, the same as ZB-V and a sixth of 1F1B's
``6(P-1)`` fill. (The report's count read with ``F&B = F + B`` is ``(P-1)(F + 2I - W)``,
``2(P-1)`` at unit costs: its ``F&B`` assumes the pair overlaps, which is what its own
bubble is built from; this is the count of this order in a runtime without that overlap,
tested in ``tests/schedules/test_dualpipev.py``. With ``I > F`` the idle time grows with
``P`` faster than linearly and no closed form is claimed.)

**Memory**: every rank holds at most ``2P + 1`` chunk activations (F until its W or B), the
report's ``PP + 1`` with ``PP = 2P``: half a stage unit above 1F1B's first rank (``P`` stage
units), and on every rank. Counted by the tests.

P=2, M=4 (stages 0,3 on rank 0 and 1,2 on rank 1), each rank's program, pairs bracketed::

    rank0  0F0 0F1 0F2 3F0 3I0 3W0 3F1 [0F3 3B1] [3F2 0B0] 3B2 [3F3 0B1] 3B3 0I2 0W2 0I3 0W3
    rank1  1F0 2F0 1F1 2F1 1F2 2B0 [2F2 1B0] [1F3 2B1] [2F3 1B1] 2B2 1B2 2I3 1I3 2W3 1W3

At ``F = I = W = 1`` (``B = 2``) it takes 25 = 6M + P - 1.
"""

from __future__ import annotations

from collections import deque

from ..ir import Op, Schedule
from .registry import Shape, register
from .v_shape import Pass, v_schedule

__all__ = ["dualpipev", "dualpipev_order"]


def dualpipev_order(P: int, M: int) -> list[list[Pass]]:
    """Every rank's passes of one iteration of ``M >= 2P`` micro-batches (module docstring)."""
    if M < 2 * P:
        raise ValueError(f"dualpipev needs microbatches >= 2 x stages = {2 * P}, got {M}; "
                         f"raise --microbatches to at least {2 * P}")
    return [_rank_order(P, M, r) for r in range(P)]


class _RankProgram:
    """One rank's passes as they are appended: micro-batch counters and the owed ``W``'s."""

    def __init__(self, stages: tuple[int, int]) -> None:
        self.stages = stages
        self.passes: list[Pass] = []
        self.forwards = [0, 0]
        self.backwards = [0, 0]
        self.owed: deque[tuple[int, int]] = deque()  # (stage, i) whose I ran, W not yet

    def forward(self, chunk: int) -> None:
        self.passes.append((Op.FORWARD, self.stages[chunk], self.forwards[chunk]))
        self.forwards[chunk] += 1

    def backward(self, chunk: int, *, split: bool) -> None:
        """A whole ``B``, or its ``I`` with the ``W`` owed (:meth:`weight` runs it later)."""
        stage, i = self.stages[chunk], self.backwards[chunk]
        self.passes.append((Op.BACKWARD_INPUT if split else Op.BACKWARD, stage, i))
        if split:
            self.owed.append((stage, i))
        self.backwards[chunk] += 1

    def weight(self) -> None:
        """The oldest owed ``W``, if any."""
        if self.owed:
            stage, i = self.owed.popleft()
            self.passes.append((Op.BACKWARD_WEIGHT, stage, i))


def _rank_order(P: int, M: int, r: int) -> list[Pass]:
    rank = _RankProgram((r, 2 * P - 1 - r))
    down = P - 1 - r  # ranks below this one
    for _ in range(2 * down):                           # 1: fill chunk 0
        rank.forward(0)
    for _ in range(r + 1):                              # 2: both chunks
        rank.forward(0)
        rank.forward(1)
    for _ in range(down):                               # 3: I1 W F1
        rank.backward(1, split=True)
        rank.weight()
        rank.forward(1)
    for _ in range(M - 2 * P + r + 1):                  # 4: [F0 B1] [F1 B0]
        rank.forward(0)
        rank.backward(1, split=False)
        rank.forward(1)
        rank.backward(0, split=False)
    for _ in range(down):                               # 5: B1 [F1 B0]
        rank.backward(1, split=False)
        rank.forward(1)
        rank.backward(0, split=False)
    split = False
    middle = (r + 1) // 2
    for step in range(r + 1):                           # 6: B1 B0, split from the middle on
        split = split or (step == middle and r % 2 == 1)
        rank.backward(1, split=split)
        split = split or (step == middle and r % 2 == 0)
        rank.backward(0, split=split)
    for _ in range(down):                               # 7: W I0
        rank.weight()
        rank.backward(0, split=split)
    while rank.owed:                                    # 8: the W's still owed
        rank.weight()
    assert rank.forwards == [M, M] and rank.backwards == [M, M], (P, M, r)
    return rank.passes


def _min_microbatches(shape: Shape) -> int:
    """``2P`` per data-parallel copy with the V; any ``M`` as plain 1F1B (one chunk)."""
    return 2 * shape.stages * shape.width if shape.chunks == 2 else 1


@register("dualpipev",
          description="DualPipeV: DeepSeek-V3's bidirectional DualPipe in a V, two chunks per "
                      "rank, a forward paired with another micro-batch's backward, backward "
                      "split at the ends; M >= 2P, flush per iteration",
          paper="DeepSeek-AI, DeepSeek-V3 Technical Report, 2024, §3.2.1 (DualPipe); V form "
                "as torch.distributed.pipelining.ScheduleDualPipeV",
          synchronous=True, default_chunks=2, placement="v",
          min_microbatches=_min_microbatches,
          width=True, replicas=True, chunks=(1, 2), split_backward=True, torch_schedule="DualPipeV")
def dualpipev(shape: Shape) -> Schedule:
    return v_schedule("dualpipev", shape, dualpipev_order)
