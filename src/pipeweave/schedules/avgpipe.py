"""AvgPipe: N parallel 1F1B pipelines with advance forward propagation and elastic averaging.

**Advance forward propagation** (avgpipe.txt §4.2, Algorithm 1, Fig. 7). 1F1B starts the first
GPU with ``K - 1`` forwards (Algorithm 1 line 1, ``advance_num = K - 1``, "equivalent to
1F1B"); AvgPipe raises that count so the forwards of later micro-batches are already on the
wire while downstream GPUs compute, hiding communication. Option ``advance`` is how many
forwards are run *beyond* 1F1B's warm-up. The early activations keep streaming down the
pipeline, so every stage starts its one-forward-one-backward phase ``advance`` micro-batches
later: stage ``s`` warms up with ``min(P - s - 1 + advance, M)`` forwards (a 1F1B pipeline that
is ``advance`` stages deeper). That is the reading under which §4.2's two limits hold
literally: ``advance = 0`` is 1F1B and "the forward propagation of all micro-batches in
advance" (``advance >= M - 1``, or ``"all"``) is AFAB, i.e. GPipe's order on every stage.
(Algorithm 1 is written for the first GPU only; running the extra forwards there alone would
leave the downstream stages in 1F1B order and could never become AFAB.) Stage ``s`` holds at
most ``min(P - s + advance, M)`` activations: Fig. 7(c), two GPUs, ``advance = 1``, "the first
GPU stashes the activation of three micro-batches, while there are two ... for 1F1B".
Algorithm 1 also raises ``advance_num`` between iterations while training gets faster and
memory allows (lines 9-10). A schedule is fixed data, so that loop lives in the runtime
(:mod:`pipeweave.runtime.advance.online`): it runs one iteration at a time, each laid out here
with option ``first_iteration = k`` (iterations ``k .. k+K-1`` of the run, with the run's
micro-batch numbers and versions) at the advance the controller chose. Every iteration ends
with a flush, so iteration ``k`` alone is exactly iteration ``k``'s actions of the whole
run's schedule, in the same order (tests/schedules/test_avgpipe.py checks it).

P=2, M=4, advance=1 (Fig. 7(c)), unit-cost timeline::

    rank0  0F0 0F1 0F2 .   0B0 0F3 0B1 .   0B2 0B3
    rank1  .   1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3

**Parallel pipelines** (§3.2, Fig. 6). ``N = Shape.pipelines`` independent models, co-partitioned
on the same ``P`` ranks (pipeline ``p``'s stage ``s`` on rank ``s``; actions carry
``pipeline=p``), each training on its own batch of ``M`` micro-batches per iteration. In the
paper every pipeline is a separate process on each GPU and the GPU serves them concurrently;
one program per rank has to serialise them, so we interleave them step by step: at every step
of the single pipeline's unit-cost timeline a rank runs that step for pipeline 0, 1, ...,
N-1. Each pipeline keeps its own order (and memory bound), none waits for another, and the
result is deadlock-free because every dependency points to an earlier step. Iterations never
interleave on a rank: the updates are free in the unit-cost timeline, so pipeline 0's first
forward of iteration ``k+1`` ties with pipeline 1's update ``U@k+1``; the iteration breaks
the tie (``... 0U@1 0AV@1 0U@1#1 0AV@1#1 | 0F4 0F4#1 ...``), which gives every rank a clean
point after each iteration where a checkpoint is exact (runtime/checkpoint/recovery.py) and makes the
run's program the concatenation of its single iterations (runtime/advance/online.py).

**Updates.** Each pipeline ends each iteration with its own optimizer step ``U@k+1`` (step 1 in
§3.2, after an all-reduce when a stage is replicated), followed by ``AV@k+1``: send the local
update to the reference model and pull the parallel model toward it by ``alpha = 1/N``
(steps 2-3). The runtime interprets ``AV``; the schedule only places it. With ``N = 1`` the
reference model is the parallel model and ``AV`` changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Op, Schedule, walk
from .common import Order, flush_schedule
from .registry import Shape, register

__all__ = ["avgpipe", "advance_order", "parse_advance"]


def parse_advance(value: object, microbatches: int) -> int:
    """The ``advance`` option as a count of extra forwards (``"all"`` = ``M - 1``, AFAB;
    ``None``, unset, = 0, 1F1B)."""
    if value is None:
        return 0
    if value == "all":
        return max(microbatches - 1, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"advance must be an integer >= 0 (extra forwards beyond 1F1B's warm-up) or 'all' "
            f"(AFAB), got {value!r}; use advance=0 for 1F1B or advance='all' for GPipe's order"
        )
    return value


def advance_order(advance: int) -> Order:
    """1F1B whose warm-up on every stage is ``advance`` forwards longer (capped at ``M``)."""

    def order(position: int, depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
        n = len(microbatches)
        warmup = min(depth - position - 1 + advance, n)
        sequence = [(Op.FORWARD, microbatches[i]) for i in range(warmup)]
        for i in range(n - warmup):
            sequence.append((Op.FORWARD, microbatches[warmup + i]))
            sequence.append((Op.BACKWARD, microbatches[i]))
        sequence.extend((Op.BACKWARD, microbatches[i]) for i in range(n - warmup, n))
        return sequence

    return order


@register("avgpipe", description="AvgPipe: N parallel 1F1B pipelines with advance forward "
                                 "propagation; per-pipeline update then elastic averaging (AV)",
          paper="Z. Chen, W. Qian, \"Elastic Averaging for Efficient Pipelined DNN Training\" (AvgPipe), §3.2, §4.2, Algorithm 1, Fig. 7", synchronous=True,
          options=("advance", "first_iteration"),
          pipelines=True, width=True, semantics=("alpha", "average_order"), online_advance=True)
def avgpipe(shape: Shape) -> Schedule:
    if shape.chunks != 1:
        raise ValueError(f"avgpipe runs one chunk per rank, got chunks={shape.chunks}; set chunks=1")
    if shape.replicas is not None:
        # A replica sees every r-th micro-batch, so stretching each replica's warm-up on its
        # own can deadlock against its neighbours (e.g. P=3, replicas=(1,1,2), advance=2).
        raise ValueError(f"avgpipe does not support per-stage replicas ({list(shape.replicas)}); "
                         "replicate whole pipelines with width, or add parallel pipelines")
    advance = parse_advance(shape.option("advance", 0), shape.microbatches)
    first = shape.option("first_iteration", 0)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(f"first_iteration must be an integer >= 0 (the run's iteration the "
                         f"schedule starts at), got {first!r}")
    single = flush_schedule("avgpipe", shape, advance_order(advance), first_iteration=first,
                            advance=advance)
    with_averaging = [_add_averaging(program) for program in single.programs]
    base = single.with_programs(with_averaging)
    times = walk(base, lambda _rank, action: 1.0 if action.is_compute else 0.0).start
    programs = []
    for rank, program in enumerate(with_averaging):
        keyed = [((_iteration(action, shape.microbatches), times[rank][i], p, i),
                  action.with_(pipeline=p) if p else action)
                 for p in range(shape.pipelines) for i, action in enumerate(program)]
        programs.append([action for _, action in sorted(keyed, key=lambda e: e[0])])
    return base.with_programs(programs, pipelines=shape.pipelines)


def _iteration(action: Action, microbatches: int) -> int:
    """The iteration an action belongs to (an update ``U@k+1``/``AV@k+1`` ends iteration k)."""
    if action.microbatch is not None:
        return action.microbatch // microbatches
    assert action.version is not None, action
    return action.version - 1


def _add_averaging(program: Sequence[Action]) -> list[Action]:
    out: list[Action] = []
    for action in program:
        out.append(action)
        if action.op is Op.STEP:
            out.append(Action(Op.AVERAGE, action.stage, version=action.version,
                              pipeline=action.pipeline))
    return out
