"""The axes of the search: each is a name and a function from a partial candidate to values.

An axis sees the values the axes before it chose (a plain dict) and the problem, and yields
its own values; :func:`enumerate_candidates` takes the product. Adding an axis is adding one
:class:`Axis` to :data:`DEFAULT_AXES` (and a field to :class:`~pipeweave.auto.problem.Candidate`).
What a schedule supports is read off its registry entry
(:class:`~pipeweave.schedules.ScheduleInfo`: ``width``, ``chunks``, ``pipelines``), never
listed here, so a newly registered schedule joins every axis with no code.

=============  ===============================================================================
axis           values
=============  ===============================================================================
schedule       every registered schedule; asynchronous ones only with ``semantics="any"``
               (:data:`~pipeweave.auto.problem.SEMANTICS`)
depth, width   ``d`` dividing ``ranks`` with ``d <= blocks``, ``w = ranks / d`` (WPipe's d:w);
               ``w > 1`` only for schedules that run data-parallel copies
chunks         the schedule's ``default_chunks`` and twice that, where it accepts them (a
               schedule with one chunk stays at one)
pipelines      N in 1, 2, 4 for schedules that lay out parallel pipelines (AvgPipe) with
               ``semantics`` ``averaged`` or ``any`` (N > 1 is another learning rule), else 1
microbatches   M = w * m, m in d, 2d, 4d, 8d, and the default plan's 2 * ranks, where M divides
               the batch B (the micro-batch ``B / M`` must be whole samples)
method         every registered partition method (``pipeweave plan --method``)
recompute      k, the first k of the S = d * chunks stages recompute (:func:`recompute_counts`):
               0 and S without a memory limit (a partial prefix is never faster than none,
               only smaller), every k in 0..S under one (0, 1, 2, 4, ..., S past 8 stages);
               a prefix because a 1F1B-like schedule holds ``min(M, S - s)`` micro-batches
               on stage s, the most on the first stages (docs/auto.md)
apc            False, and with ``semantics="any"`` True when some link is finite (halves the
               bytes between stages; lossy, fp16 on the wire, so like asynchronous semantics
               it changes the numbers trained and must be asked for)
shard          ``none``, and under a memory limit ``full`` and ``grad-op`` where the stage
               has ``w > 1`` copies and the plan can be sharded (``planner.sharding``; no
               APC, no tied weights): the
               same training, less memory, more time (the gathers), so only worth it when
               the replicated plan does not fit
tp             the size whose view the problem's profile is (1: the whole model):
               :func:`~pipeweave.auto.search.search` runs one search per size of ``--tp``
               on its own problem (:mod:`pipeweave.auto.tensor_parallel`)
=============  ===============================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..planner import available_methods
from ..planner.sharding import SHARD_MODES, check_shard
from ..schedules import available_schedules, get_info
from .problem import AutoProblem, Candidate, allows

__all__ = ["Axis", "DEFAULT_AXES", "enumerate_candidates", "divisors", "recompute_counts"]

Values = Callable[[dict[str, Any], AutoProblem], Iterable[Any]]


@dataclass(frozen=True)
class Axis:
    """``name``: the candidate field it sets; ``values(partial, problem)``: its values."""

    name: str
    values: Values


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(partial: dict[str, Any], problem: AutoProblem) -> Iterable[str]:
    names = problem.schedules or tuple(info.name for info in available_schedules())
    for name in names:
        if get_info(name).synchronous or allows(problem.semantics, "stale weights"):
            yield name


def _depths(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    wanted = problem.depths or tuple(divisors(problem.ranks))
    for depth in wanted:
        if problem.ranks % depth or depth > problem.profile.num_blocks:
            continue
        if depth != problem.ranks and not get_info(partial["schedule"]).width:
            continue
        yield depth


def _width(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    yield problem.ranks // partial["depth"]


def _chunks(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    info = get_info(partial["schedule"])
    default = info.default_chunks
    for chunks in (default, 2 * default) if default > 1 else (1,):
        if partial["depth"] * chunks <= problem.profile.num_blocks and (
                chunks == 1 or info.takes_chunks(chunks)):
            yield chunks


def _pipelines(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    wanted = problem.pipelines or (1, 2, 4)
    for count in wanted:
        if count == 1 or (get_info(partial["schedule"]).pipelines
                          and allows(problem.semantics, "averaged")):
            yield count


def _microbatches(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    if problem.microbatches is not None:
        wanted: Sequence[int] = problem.microbatches
    else:
        depth, width = partial["depth"], partial["width"]
        wanted = sorted({width * depth * k for k in (1, 2, 4, 8)} | {problem.default_microbatches})
    for m in wanted:
        if problem.batch % m == 0:
            yield m


def _methods(partial: dict[str, Any], problem: AutoProblem) -> Iterable[str]:
    yield from problem.methods or tuple(available_methods())


PREFIXES_IN_FULL = 8
"""Up to this many stages every prefix length is searched under a memory limit; past it the
lengths double (1, 2, 4, ...), so a deep pipeline adds ``log2 S`` values, not ``S``."""


def recompute_counts(stages: int, limited: bool) -> tuple[int, ...]:
    """How many leading stages may recompute, for ``stages`` stages (module docstring)."""
    if not limited:
        return (0, stages)
    if stages <= PREFIXES_IN_FULL:
        return tuple(range(stages + 1))
    doubling = [1 << j for j in range(stages.bit_length()) if 1 << j < stages]
    return (0, *doubling, stages)


def _recompute(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    stages = partial["depth"] * partial["chunks"]
    if problem.recompute is not None:
        yield from sorted({min(k, stages) for k in problem.recompute})
        return
    yield from recompute_counts(stages, problem.memory_limit is not None)


def _apc(partial: dict[str, Any], problem: AutoProblem) -> Iterable[bool]:
    if problem.apc is not None:
        yield from problem.apc
        return
    yield False
    if allows(problem.semantics, "lossy messages") and _some_link_finite(problem):
        yield True


def _some_link_finite(problem: AutoProblem) -> bool:
    if problem.topology is not None:
        return any(not math.isinf(level.bandwidth) for level in problem.topology.levels)
    return problem.profile.link is not None


def _shard(partial: dict[str, Any], problem: AutoProblem) -> Iterable[str]:
    wanted = problem.shard or (SHARD_MODES if problem.memory_limit is not None else ("none",))
    for mode in wanted:
        if mode != "none" and (partial["apc"] or problem.profile.ties):
            continue  # compressed messages and tied weights are not sharded yet (sharding.md)
        try:
            check_shard(mode, schedule=partial["schedule"], width=partial["width"],
                        replicas=None, pipelines=partial["pipelines"])
        except ValueError:
            continue
        yield mode


def _tp(partial: dict[str, Any], problem: AutoProblem) -> Iterable[int]:
    # one size per search, the one its profile is the view of: :func:`~pipeweave.auto.search.
    # search` searches each size of ``problem.tp`` on its own problem (auto/tensor_parallel.py)
    yield int(problem.profile.metadata.get("tp", 1))


DEFAULT_AXES: tuple[Axis, ...] = (
    Axis("schedule", _schedules),
    Axis("depth", _depths),
    Axis("width", _width),
    Axis("chunks", _chunks),
    Axis("pipelines", _pipelines),
    Axis("microbatches", _microbatches),
    Axis("method", _methods),
    Axis("recompute", _recompute),
    Axis("apc", _apc),
    Axis("shard", _shard),
    Axis("tp", _tp),
)


def enumerate_candidates(problem: AutoProblem,
                         axes: Sequence[Axis] = DEFAULT_AXES) -> Iterator[Candidate]:
    """Every combination of the axes' values, in axis order."""

    def extend(index: int, partial: dict[str, Any]) -> Iterator[Candidate]:
        if index == len(axes):
            yield Candidate(**partial)
            return
        axis = axes[index]
        for value in axis.values(partial, problem):
            yield from extend(index + 1, {**partial, axis.name: value})

    yield from extend(0, {})
