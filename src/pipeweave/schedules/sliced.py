"""AutoPipe's Slicer: 1F1B whose first micro-batches are forwarded in two halves.

Startup overhead is the time the last stage waits for its first activation (autopipe.txt
§II-B): ``(P-1) F`` in 1F1B. Splitting micro-batch 0 into halves ``a``/``b`` lets its first half
reach the last stage after ``(P-1) F/2``, halving it (§III-C, Fig. 8(b)); the last stage then
starts its first backward ``(P-1) F/2`` earlier and the whole pipeline shifts forward. Only the
forwards are split — §III-C reschedules the Warmup phase, which runs only forwards, and counts
the cost as doubling "the FP operations' communication numbers" — so every backward stays
whole and no extra memory is held: the two halves together hold one micro-batch's activation.

P=4, M=4, one sliced micro-batch (Fig. 8(b)), F=1 (0.5 per half), B=2, comm=0, timeline in
half steps (``-`` continues the action on its left); the last stage starts at 1.5, not 3::

    rank0  0F0a 0F0b 0F1  -    0F2  -    0F3  -    .    .    .    .    .    .    .    .    .    0B0 ...
    rank1  .    1F0a 1F0b .    1F1  -    1F2  -    .    .    .    .    .    1B0  -    -    -    1F3 ...
    rank2  .    .    2F0a 2F0b .    .    2F1  -    .    2B0  -    -    -    2F2  -    2B1  -    - ...
    rank3  .    .    .    3F0a 3F0b 3B0  -    -    -    3F1  -    3B1  -    -    -    3F2  -    3B2 ...

How many micro-batches to slice comes from Algorithm 2 (:func:`slicer_count`), from the stage
costs (option ``costs = (forward, backward, comm)``), or is given (option ``sliced = k``);
without either, Algorithm 2 runs with uniform costs F=1, B=2, comm=0. The first ``k``
micro-batches of every iteration (of every pipeline copy, with ``width``) are sliced,
on every stage.

Not done: §III-C also aggregates the communication of the two halves where the first half's
send would block (the receiver is already busy with a backward). That blockage comes from
synchronous sends; pipeweave's sends are asynchronous (:mod:`pipeweave.ir.lower`), so the
sender never waits for a busy receiver. Expressing the aggregation (a whole forward consuming
two halves) would also need a second dependency rule next to ``F(s,j,h) <- F(s-1,j,h)``, so a
sliced micro-batch is split on every stage and its halves travel separately.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..ir import Action, Op, Schedule
from .common import flush_schedule, one_f_one_b_order, routed
from .registry import Shape, register

__all__ = ["sliced_1f1b", "slicer_count", "slice_forwards", "sliced_count"]


def slicer_count(forward: Sequence[float], backward: Sequence[float], comm: float, *,
                 half_forward: Sequence[float] | None = None,
                 half_backward: Sequence[float] | None = None) -> int:
    """Algorithm 2 of autopipe.txt: how many micro-batches to slice for these stage costs.

    Args:
        forward: forward time of each stage (``f_i``), stage 0 first.
        backward: backward time of each stage (``b_i``).
        comm: cost of one activation/gradient transfer between stages (``Comm``).
        half_forward, half_backward: each stage's times on half a micro-batch (default: half
            the whole's, the paper's); micro-batch 0's B, two halves, costs ``2 half_backward``.

    The pseudo-code is followed line by line (comments give its line numbers). ``startt``
    holds the backward wave of the sliced micro-batch 0, i.e. when each stage must have its
    first 1F1B forward done; ``endt[i][h]`` when half ``h`` of the latest sliced micro-batch
    leaves stage ``i``, a send completing only once the next stage has finished its previous
    half (line 26). Two readings of the printed text: line 34 prints ``tempt <= endt[0][1]``,
    but the prose says the algorithm returns once the start time of the unbroken micro-batch
    "is greater than or equal to" the end of the sliced one's second half, and with ``<=``
    the loop could only stop at ``mb = 1`` (``tempt - endt[0][1]`` grows with ``mb``), so we
    use ``>=``; and ``startt`` has ``p`` entries, so ``mb`` stops at ``p`` (the printed loop has
    no bound). With measured halves the count means what it means in the paper: the fewest
    sliced micro-batches whose second halves leave stage 0 before the first unbroken forward
    must start there.
    """
    p = len(forward)  # line 2: p, the number of stages ("blocks") of the partition
    if p == 0 or len(backward) != p:
        raise ValueError(f"slicer_count needs one forward and one backward time per stage, got "
                         f"{len(forward)} forward and {len(backward)} backward times")
    f, b = [float(x) for x in forward], [float(x) for x in backward]  # line 1
    hf, hb = _halves(f, half_forward), _halves(b, half_backward)
    startt = [0.0] * p  # lines 3-4
    endt = [[0.0, 0.0] for _ in range(p + 1)]  # lines 3-4; endt[p] stays 0 (read by line 26)
    tempt, mb = 0.0, 1  # line 5
    for i in range(p - 1):  # line 6: i = 0 .. p-2
        tempt = tempt + hf[i] + comm / 2  # line 7: first half of micro-batch 0 goes down
    tempt = tempt + hf[p - 1]  # line 9
    for i in range(p - 1, 0, -1):  # line 10: i = p-1 .. 1
        tempt = tempt + 2 * hb[i] + comm  # line 11: micro-batch 0's backward comes back up
        startt[p - 1 - i] = tempt  # line 12
    tempt = tempt + 2 * hb[0]  # line 14
    startt[p - 1] = tempt  # line 15
    while True:  # line 16
        for i in range(p - mb + 1):  # line 17: i = 0 .. p-mb
            for j in (0, 1):  # line 18: first half, second half
                endt[i][j] = endt[i][(j + 1) % 2] + hf[i]  # line 19
                if i > 0:  # line 20
                    endt[i][j] = max(endt[i][j], endt[i - 1][j] + hf[i - 1])  # line 21
                if i != p - 1:  # line 23
                    endt[i][j] = endt[i][j] + comm / 2  # line 24
                endt[i][j] = max(endt[i][j], endt[i + 1][(j + 1) % 2])  # line 26
        tempt = startt[mb - 1]  # line 29: first 1F1B forward of stage p-1-mb must be done
        for i in range(p - 1 - mb, 0, -1):  # line 30: i = p-1-mb .. 1
            tempt = tempt - f[i] - comm  # line 31: ... so it leaves stage 0 no later than this
        tempt = tempt - f[0]  # line 33
        if tempt >= endt[0][1]:  # line 34 (see docstring: ">=" as the prose says)
            return mb  # line 35
        if mb == p:  # bound: startt has p entries
            return mb
        mb = mb + 1  # line 37


def _halves(whole: list[float], half: Sequence[float] | None) -> list[float]:
    """``half`` per stage, or half of ``whole`` (the paper's even split)."""
    if half is None:
        return [x / 2 for x in whole]
    if len(half) != len(whole):
        raise ValueError(f"slicer_count needs a half time for each of the {len(whole)} stages, "
                         f"got {len(half)}")
    return [float(x) for x in half]


def slice_forwards(program: Sequence[Action], sliced: set[int]) -> list[Action]:
    """Replace each forward of a micro-batch in ``sliced`` by its two halves, in place."""
    out: list[Action] = []
    for action in program:
        if action.op is Op.FORWARD and action.microbatch in sliced:
            out.extend((action.with_(piece=1), action.with_(piece=2)))
        else:
            out.append(action)
    return out


@register("sliced-1f1b", description="AutoPipe Slicer: 1F1B with the first k micro-batches "
                                     "forwarded in halves (k from Algorithm 2 or option sliced)",
          paper="W. Liu et al., AutoPipe: A Fast Pipeline Parallelism Approach with Balanced Partitioning and Micro-batch Slicing, IEEE CLUSTER 2022, §III-C, Algorithm 2", synchronous=True,
          options=("sliced", "costs"),
          width=True, replicas=True, chunks=None, sliced="sliced-1f1b")
def sliced_1f1b(shape: Shape) -> Schedule:
    k = sliced_count(shape)
    base = flush_schedule("sliced-1f1b", shape, one_f_one_b_order, sliced=k)
    layout, M = base.layout, shape.microbatches
    # The micro-batches sliced are the first k that each replica of stage 0 starts in each
    # iteration (with width: the first k of every pipeline copy); every stage slices the same.
    sliced = {j for t in range(shape.iterations) for first in layout.stage_ranks[0]
              for j in routed(layout, 0, first, range(t * M, (t + 1) * M))[:k]}
    programs = [slice_forwards(program, sliced) for program in base.programs]
    return base.with_programs(programs)


def sliced_count(shape: Shape) -> int:
    """How many micro-batches of each iteration ``shape`` slices (its options, or Algorithm 2
    with uniform costs)."""
    given, costs = shape.option("sliced", None), shape.option("costs", None)
    if given is not None and costs is not None:
        raise ValueError("give either sliced=k or costs=(forward, backward, comm), not both")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given <= shape.microbatches:
            raise ValueError(f"sliced must be an integer in 0..M={shape.microbatches} (how many "
                             f"micro-batches to forward in halves), got {given!r}; e.g. sliced=1")
        return given
    if costs is None:
        return min(slicer_count([1.0] * shape.stages, [2.0] * shape.stages, 0.0), shape.microbatches)
    forward, backward, comm = _check_costs(costs, shape.stages)
    return min(slicer_count(forward, backward, comm), shape.microbatches)


def _check_costs(costs: object, stages: int) -> tuple[list[float], list[float], float]:
    fix = f"give costs=(forward times, backward times, comm) with {stages} times each, e.g. " \
          f"costs=({[1.0] * stages}, {[2.0] * stages}, 0.0)"
    if not isinstance(costs, (tuple, list)) or len(costs) != 3:
        raise ValueError(f"costs must be a triple (forward, backward, comm), got {costs!r}; {fix}")
    forward, backward, comm = costs
    times = []
    for name, value in (("forward", forward), ("backward", backward)):
        if not isinstance(value, (tuple, list)) or len(value) != stages:
            raise ValueError(f"costs' {name} times must list one time per stage ({stages}), got "
                             f"{value!r}; {fix}")
        if not all(_is_time(x) for x in value):
            raise ValueError(f"costs' {name} times must be numbers >= 0, got {value!r}; {fix}")
        times.append([float(x) for x in value])
    if not _is_time(comm):
        raise ValueError(f"costs' comm must be a number >= 0, got {comm!r}; {fix}")
    return times[0], times[1], float(comm)


def _is_time(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)
