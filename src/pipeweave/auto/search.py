"""The search: enumerate the candidates, prune with bounds, simulate the survivors, rank.

::

    enumerate (axes.py) ──► valid? (schedule/plan validation) ──► sort by shape bound
        ──► for each, best first:  shape bound can't beat the best?  ─► pruned (and all after it)
                                   partition (planner methods), options, plan
                                   static memory > limit?            ─► pruned
                                   held floor > limit (held_floor.py)? ─► pruned
                                   plan bound (or a simulated twin
                                   recomputing fewer stages) can't beat the best? ─► pruned
                                   simulate (timing only)            ─► simulated
                                   memory floor > limit?             ─► pruned (memory)
                                   memory model: peak > limit?       ─► over the limit, never chosen

Under ``time_limit`` the estimated cost (:mod:`pipeweave.auto.budget`) is checked before the
candidate is partitioned, before it is simulated and before the memory model is asked, so
neither is started when it would run past the limit (counted ``over_budget``).

"Can't beat the best" compares the bound's samples/s (``B * N / bound``) with the best
simulated candidate that fits the memory limit; the bounds are true lower bounds of the
simulated time (:mod:`pipeweave.auto.bounds`), so pruning never loses the optimum of the
simulator over the space. Candidates are ranked by predicted samples/s, then by smaller peak
memory. The default plan (1F1B, uniform split over all ranks, M = 2 x ranks) is always
predicted too, for comparison.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ..collector import frozen_between
from ..planner.plan import Plan
from ..profiler import Profile
from ..schedules import Shape, get_info
from ..schedules.registry import check_options
from ..sim import Costs
from .axes import DEFAULT_AXES, Axis, enumerate_candidates
from .bounds import plan_bound, reduce_bound, shape_bound
from .budget import Budget, work_units
from .floors import StateFloor, inflight_floor
from .held_floor import held_floor
from .links import default_topology
from .tensor_parallel import tp_problem, tp_refusal, tp_sizes
from .memory import memory_at_hand, memory_floor, static_memory
from .partitioning import Partitioner
from .prefix_twins import PrefixTwins
from .program_bound import plan_program_bound
from .predict import (Prediction, Timed, candidate_costs, candidate_plan, one_copy_suffices,
                      predict, simulate_candidate, with_memory, with_options)
from .problem import AutoProblem, Candidate
from .ranking import identity
from .scaling import scaled_profile
from .ties import TieRefused, check_ties
from .twin_key import twin_key
from .timing import floor_programs

__all__ = ["SearchResult", "search", "default_candidate", "default_prediction", "Progress"]

Progress = Callable[[str], None]

TABLE_MEMORY = 30
"""Simulated candidates that could not win (slower than the best when simulated) get their
memory predicted only for the fastest this many of them: the table and the plot. With
``AutoProblem.table_rows`` (``auto --top``) only as many of those as the table's rows need
(:func:`_rows_memory`)."""


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        ranked: the simulated candidates that fit the memory limit, best first: every one that
            was the fastest so far when simulated, and the fastest :data:`TABLE_MEMORY` of the
            rest (the memory model is asked only for those).
        over_limit: simulated candidates whose predicted peak exceeds the limit.
        default: the default plan's prediction (``None`` if it cannot be built).
        considered: candidates enumerated; ``invalid`` of them were refused by the schedule
            or plan validation, ``pruned`` by a bound, ``simulated`` were simulated, and
            ``duplicates`` turned out to be a plan already simulated (two partition methods
            often agree): they share its prediction and are ranked once; ``unexamined``
            were left when ``time_limit`` ran out; ``over_budget`` were skipped under
            ``time_limit`` because their estimated cost (:mod:`pipeweave.auto.budget`) did
            not fit in the time left.
        pruned_time, pruned_memory: the pruned ones by the reason.
        seconds: wall time of the search.
        refused_ties: of the invalid, those that split a tied parameter over stages their
            schedule cannot keep exact (:mod:`pipeweave.auto.ties`; ``pipeweave train`` would
            refuse them); ``tie_reason`` the first one's reason.
    """

    problem: AutoProblem
    ranked: tuple[Prediction, ...]
    over_limit: tuple[Prediction, ...]
    default: Prediction | None
    considered: int
    invalid: int
    pruned_time: int
    pruned_memory: int
    simulated: int
    duplicates: int
    seconds: float
    unexamined: int = 0
    over_budget: int = 0
    refused_ties: int = 0
    tie_reason: str | None = None

    @property
    def pruned(self) -> int:
        return self.pruned_time + self.pruned_memory

    @property
    def winner(self) -> Prediction:
        if not self.ranked:
            raise ValueError(self.no_fit_message())
        return self.ranked[0]

    def no_fit_message(self) -> str:
        limit = self.problem.memory_limit
        smallest = min((p.max_memory for p in self.over_limit), default=None)
        if limit is not None and smallest is not None:
            return (f"no candidate fits --memory-limit {limit:.6g} bytes: the smallest "
                    f"predicted peak is {smallest:.6g} bytes per rank ({self.considered} "
                    f"candidates considered); raise --memory-limit to at least {smallest:.6g} "
                    f"or use more ranks")
        if limit is not None:
            return (f"no candidate fits --memory-limit {limit:.6g} bytes: even the parameters, "
                    f"gradients and optimizer state of every split exceed it "
                    f"({self.considered} candidates considered); raise --memory-limit or use "
                    "more ranks")
        return (f"no valid candidate among {self.considered} for {self.problem.ranks} ranks and "
                f"{self.problem.profile.num_blocks} blocks; check --ranks and --batch-size")


def default_candidate(problem: AutoProblem) -> Candidate:
    """1F1B, uniform split over all ranks, M = 2 x ranks, nothing else."""
    return Candidate(schedule="1f1b", method="uniform", depth=problem.ranks, width=1, chunks=1,
                     pipelines=1, microbatches=problem.default_microbatches, recompute=0,
                     apc=False)


@dataclass
class _Search:
    problem: AutoProblem
    progress: Progress
    partitioner: Partitioner = field(init=False)
    state_floor: StateFloor = field(init=False)
    prefixes: PrefixTwins = field(init=False)
    """Lower bounds of recompute prefixes from their twins recomputing fewer stages."""
    profiles: dict[int, Profile] = field(default_factory=dict)
    invalid: int = 0
    pruned_time: int = 0
    pruned_memory: int = 0
    simulated: int = 0
    duplicates: int = 0
    seen: set[str] = field(default_factory=set)
    budget: Budget = field(default_factory=Budget)
    over_budget: int = 0
    refused_ties: int = 0
    tie_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    ranked: list[Prediction] = field(default_factory=list)
    """Simulated candidates that fit the memory limit."""
    over: list[Prediction] = field(default_factory=list)
    """Simulated candidates over the memory limit."""
    slower: list[Timed] = field(default_factory=list)
    """Simulated candidates that could not win: their memory is asked later, for the table."""
    best: float = 0.0
    """Samples/s of the best candidate that fits."""
    unexamined: int = 0
    twins: dict[str, list[tuple[tuple[bool, ...], float]]] = field(default_factory=dict)
    """Simulated iteration times by plan less its recomputation (:meth:`twin_bound`)."""

    def __post_init__(self) -> None:
        self.partitioner = Partitioner(self.problem)
        self.state_floor = StateFloor(self.problem)
        self.prefixes = PrefixTwins(self.problem)

    def profile(self, candidate: Candidate) -> Profile:
        size = self.problem.batch // candidate.microbatches
        if size not in self.profiles:
            self.profiles[size] = scaled_profile(self.problem.profile, size,
                                                 self.problem.extra_profiles)
        return self.profiles[size]

    def complete(self, candidate: Candidate) -> tuple[Candidate, Plan, Profile]:
        """Partition, fill the options, build the plan (ValueError: not valid)."""
        profile = self.profile(candidate)
        partition = self.partitioner(candidate, profile)
        replicas = partition.replicas if candidate.width == 1 and candidate.chunks == 1 else None
        depth = len(partition.bounds) if replicas is not None else candidate.depth
        done = replace(candidate, bounds=tuple(partition.bounds), replicas=replicas, depth=depth)
        done = with_options(done, profile, self.problem)
        plan = candidate_plan(done, self.problem)
        _check_shape(plan)
        return done, plan, profile

    def evaluate(self, candidate: Candidate, profile: Profile) -> Timed:
        self.simulated += 1
        started = time.perf_counter()
        timed = simulate_candidate(candidate, profile, self.problem)
        self.budget.record_simulation(candidate, time.perf_counter() - started)
        return timed

    def twin_bound(self, plan: Plan, key: str) -> float:
        """The longest simulated time of a twin of ``plan`` (the same plan, options and APC;
        ``key``, :func:`~pipeweave.auto.twin_key.twin_key`) that recomputes a subset of its stages: a lower bound of
        ``plan``'s time, since recomputation only lengthens backwards (the forward added to
        B and I) and the simulator's times never fall when a duration grows (every start is
        a maximum of ends plus delays). 0 with shared cores, whose slowdowns are not
        monotone."""
        cores = self.problem.shared_cores
        if cores is not None and cores < plan.world_size:
            return 0.0
        mine = _recomputed(plan)
        return max((time for theirs, time in self.twins.get(key, ())
                    if all(m or not t for m, t in zip(mine, theirs))), default=0.0)

    def record_twin(self, plan: Plan, key: str, iteration_time: float) -> None:
        self.twins.setdefault(key, []).append((_recomputed(plan), iteration_time))

    def over_floor(self, plan: Plan) -> bool:
        """The memory model's peak is surely over the limit (:func:`memory_floor`, for a
        synchronous schedule; it walks the schedule the simulation built and cached)."""
        limit = self.problem.memory_limit
        if limit is None or not get_info(plan.schedule).synchronous:
            return False
        one_copy = one_copy_suffices(plan, self.problem)
        programs = floor_programs(plan, one_copy=one_copy)  # columns where they exist
        return max(memory_floor(self.problem, plan, programs, one_copy=one_copy)) > limit

    def fits(self, candidate: Candidate, started: float, *, simulation: bool = True) -> bool:
        """Under ``--time-limit``: the estimated cost of what is next (the simulation and
        the memory model, or the memory model alone) fits in the time left."""
        if self.problem.time_limit is None:
            return True
        left = self.problem.time_limit - (time.perf_counter() - started)
        return self.budget.fits(candidate, left, simulation=simulation)

    def memory(self, timed: Timed) -> Prediction:
        started = time.perf_counter()
        prediction = with_memory(timed, self.problem)
        self.budget.record_memory(timed.candidate, time.perf_counter() - started)
        return prediction


def _check_shape(plan: Plan) -> None:
    """What the registry checks before generating, without generating."""
    shape = plan.shape(1)
    info = get_info(plan.schedule)
    check_options(plan.schedule, shape, info.options)
    needed = info.min_microbatches(shape)
    if plan.microbatches < needed:
        raise ValueError(f"{plan.schedule} needs M >= {needed}")


def _valid_shape(candidate: Candidate, problem: AutoProblem) -> bool:
    """Cheap validity before partitioning: the shape and the registry's checks."""
    if candidate.stages > problem.profile.num_blocks or problem.batch % candidate.microbatches:
        return False
    try:
        shape = Shape(stages=candidate.depth, microbatches=candidate.microbatches,
                      chunks=candidate.chunks, width=candidate.width,
                      pipelines=candidate.pipelines)
        info = get_info(candidate.schedule)
        return candidate.microbatches >= info.min_microbatches(shape)
    except ValueError:
        return False


def _fastest_link(problem: AutoProblem) -> float:
    topology = problem.topology or default_topology(problem.profile, problem.ranks)
    return max(level.bandwidth for level in topology.levels)


def search(problem: AutoProblem, *, axes: Sequence[Axis] = DEFAULT_AXES,
           progress: Progress | None = None) -> SearchResult:
    """Search ``problem``'s space (module docstring), one search per tensor-parallel size
    (:mod:`.tensor_parallel`; ``time_limit`` shared evenly among them), the results merged."""
    say = progress or (lambda _text: None)
    sizes = tp_sizes(problem)
    if sizes == (1,):
        return _search_one(problem, axes, say)
    refusals = {size: tp_refusal(problem, size) for size in sizes}
    searched = [size for size, refused in refusals.items() if refused is None]
    if not searched:
        raise ValueError(f"{next(r for r in refusals.values() if r)}; or give tp 1")
    results = []
    for size, refused in refusals.items():
        if refused is not None:
            say(f"not searched: {refused}")
            continue
        say(f"tp={size}: searching {problem.ranks // size} pipeline ranks of {size} processes")
        sized = tp_problem(problem, size)
        if problem.time_limit is not None:  # --time-limit shared evenly among the sizes
            sized = replace(sized, time_limit=problem.time_limit / len(searched))
        results.append(_search_one(sized, axes, say))
    return _merged(problem, results)


def _merged(problem: AutoProblem, results: Sequence[SearchResult]) -> SearchResult:
    """One result of the per-size searches (their counts summed, their ranked merged)."""
    ranked = sorted((p for r in results for p in r.ranked),
                    key=lambda p: (-p.samples_per_second, p.max_memory, _simplicity(p.candidate),
                                   identity(p.candidate)))
    whole = [r.default for r in results if r.problem.tp == (1,)]
    counted = ("considered", "invalid", "pruned_time", "pruned_memory", "simulated",
               "duplicates", "seconds", "unexamined", "over_budget", "refused_ties")
    return SearchResult(
        problem=problem, ranked=tuple(ranked),
        over_limit=tuple(p for r in results for p in r.over_limit),
        default=whole[0] if whole else default_prediction(replace(problem, tp=None)),
        tie_reason=next((r.tie_reason for r in results if r.tie_reason), None),
        **{name: sum(getattr(r, name) for r in results) for name in counted})


def _search_one(problem: AutoProblem, axes: Sequence[Axis], say: Progress) -> SearchResult:
    """Search one tensor-parallel size's space (module docstring)."""
    state = _Search(problem, say)
    candidates = list(enumerate_candidates(problem, axes))
    say(f"{len(candidates)} candidates from {len(axes)} axes")
    keyed = _by_bound(state, candidates)
    last_report = time.perf_counter()
    order = _cheap_first(keyed) if problem.time_limit is None else _safe_first(
        keyed, lambda: bool(state.ranked))
    for position, entry in enumerate(frozen_between(order)):  # collector.py: scans less
        if problem.time_limit is not None and state.ranked and \
                time.perf_counter() - state.started > problem.time_limit:
            state.unexamined = len(keyed) - position
            say(f"--time-limit {problem.time_limit:g} s spent: {state.unexamined} candidates "
                "left unexamined (the weakest bounds)")
            break
        joined = _examine(state, entry)
        if time.perf_counter() - last_report > (2.0 if joined else 10.0):
            last_report = time.perf_counter()
            say(f"searched {position + 1}/{len(keyed)}: {state.simulated} simulated, "
                f"{state.pruned_time} + {state.pruned_memory} pruned (time + memory), "
                f"best {state.best:.4g} samples/s")
    _table_memory(state)
    return _result(state, len(candidates))


class Keyed(NamedTuple):
    """A valid candidate with its sort key: best bound per sample first, then the simplest."""

    bound: float
    """:func:`~pipeweave.auto.bounds.shape_bound` of the candidate (seconds per iteration)."""
    simplicity: tuple[Any, ...]
    order: int
    """Its position among the valid candidates (the last tie-break)."""
    candidate: Candidate


def _by_bound(state: _Search, candidates: list[Candidate]) -> list[Keyed]:
    """The valid ``candidates``, best bound per sample first: the first simulations set a
    high bar for the rest. The invalid ones are counted in ``state``."""
    problem = state.problem
    valid = [c for c in candidates if _valid_shape(c, problem)]
    state.invalid += len(candidates) - len(valid)
    link = _fastest_link(problem)
    return sorted((Keyed(shape_bound(c, state.profile(c), problem, link), _simplicity(c), i, c)
                   for i, c in enumerate(valid)),
                  key=lambda e: (e.bound / e.candidate.pipelines, e.simplicity, e.order))


def _examine(state: _Search, entry: Keyed) -> bool:
    """Prune, simulate and rank one candidate; True when it joined the ranked (it fits and
    was the fastest so far)."""
    problem = state.problem
    simulated = _simulate_unless_pruned(state, entry)
    if simulated is None:
        return False
    timed, plan, done = simulated
    if timed.samples_per_second <= state.best:  # cannot win: its memory is asked only if
        state.slower.append(timed)              # it makes the table (_table_memory)
        return False
    if not state.fits(done, state.started, simulation=False):
        state.over_budget += 1
        return False
    prediction = state.memory(timed)
    if problem.memory_limit is not None and prediction.max_memory > problem.memory_limit:
        state.over.append(prediction)
        return False
    state.ranked.append(prediction)
    state.best = max(state.best, prediction.samples_per_second)
    return True


class _Simulated(NamedTuple):
    timed: Timed
    plan: Plan
    candidate: Candidate
    """The candidate completed: partition and options filled in."""


def _simulate_unless_pruned(state: _Search, entry: Keyed) -> _Simulated | None:
    """Complete and simulate ``entry``'s candidate unless a bound, the static memory, the time
    budget or a validation rules it out first (counted in ``state``; None then)."""
    problem, candidate = state.problem, entry.candidate
    samples = problem.batch * candidate.pipelines
    if _cannot_beat(samples, entry.bound, state.best, candidate) or (
            state.best > 0 and _cannot_beat(  # each stage's all-reduce after its drain:
                samples, reduce_bound(candidate, state.profile(candidate), problem),
                state.best, candidate)) or _cannot_beat(  # dearer, so asked second; then a
            samples, state.prefixes.bound(candidate), state.best, candidate):  # twin's
        state.pruned_time += 1
        return None
    if not state.fits(candidate, state.started):
        state.over_budget += 1  # too long for the time left; a cheaper one may fit
        return None
    if problem.memory_limit is not None and state.state_floor.peak(candidate) > problem.memory_limit:
        state.pruned_memory += 1  # no split fits: its method is not run (auto/floors.py)
        return None
    try:
        done, plan, profile = state.complete(candidate)
    except ValueError:
        state.invalid += 1
        return None
    if problem.memory_limit is not None and (
            max(static_memory(problem, plan)) > problem.memory_limit
            or max(held_floor(problem, plan), default=0.0) > problem.memory_limit):
        state.pruned_memory += 1  # the held_floor: what its schedule surely holds, unbuilt
        return None
    data = plan.to_json()
    key = json.dumps([data, done.apc], sort_keys=True)
    if key in state.seen:
        state.duplicates += 1
        return None
    state.seen.add(key)
    costs = candidate_costs(done, plan, profile, problem)
    twin = twin_key(data, done.apc)
    bound = max(plan_bound(plan, costs, problem), state.twin_bound(plan, twin))
    state.prefixes.record(candidate, bound)  # bounds its prefixes recomputing more
    if _cannot_beat(samples, bound, state.best, done):
        state.pruned_time += 1
        return None
    if problem.memory_limit is not None and state.best > 0 and max(inflight_floor(
            problem, plan, costs, samples / state.best)) >= problem.memory_limit:
        state.pruned_memory += 1  # fast enough to win only holding more than fits
        return None
    if not state.fits(done, state.started):
        state.over_budget += 1
        return None
    if _pruned_by_program(state, candidate, done, plan, costs):
        state.pruned_time += 1
        return None
    simulated = _checked_simulation(state, done, plan, profile)
    if simulated is not None:
        state.record_twin(plan, twin, simulated.timed.iteration_time)
        state.prefixes.record(candidate, simulated.timed.iteration_time)
    return simulated


def _pruned_by_program(state: _Search, candidate: Candidate, done: Candidate, plan: Plan,
                       costs: Costs) -> bool:
    """Each rank's fill and drain read off its built program can't beat the best
    (:mod:`~pipeweave.auto.program_bound`; asked once there is a best, and kept for the
    candidate's recompute prefixes)."""
    if state.best <= 0:
        return False
    program = plan_program_bound(plan, costs, state.problem)
    state.prefixes.record(candidate, program)
    return _cannot_beat(state.problem.batch * candidate.pipelines, program, state.best, done)


def _recomputed(plan: Plan) -> tuple[bool, ...]:
    return tuple(plan.recompute_stage(s) for s in range(len(plan.stages)))


def _checked_simulation(state: _Search, done: Candidate, plan: Plan,
                        profile: Profile) -> _Simulated | None:
    """Simulate a complete candidate whose ties its schedule keeps exact (None: refused, or
    surely over the memory limit, :func:`~pipeweave.auto.memory.memory_floor`: then it is
    neither simulated nor its memory asked)."""
    try:
        check_ties(plan, state.problem.profile)
        if state.over_floor(plan):
            state.pruned_memory += 1
            return None
        return _Simulated(state.evaluate(done, profile), plan, done)
    except TieRefused as refused:
        state.invalid += 1
        state.refused_ties += 1
        state.tie_reason = state.tie_reason or str(refused)
    except ValueError:
        state.invalid += 1
    return None


def _table_memory(state: _Search) -> None:
    """The memory of the fastest of those that could not win, for the table and the plot."""
    problem = state.problem
    state.slower.sort(key=lambda t: -t.samples_per_second)
    chosen = state.slower[:TABLE_MEMORY]
    if problem.table_rows is not None:
        _rows_memory(state, chosen, problem.table_rows)
        return
    if problem.time_limit is None:  # one shape after another: the memory model's shape
        chosen.sort(key=_shape_key)  # cache serves each shape's partitions (same results)
        predictions = _cached_first(state, chosen)
    else:
        predictions = [state.memory(timed) for timed in chosen if state.fits(
            timed.candidate, state.started, simulation=False)]  # the table then lists fewer of those that could not win
    for prediction in predictions:
        _file(state, prediction)


def _file(state: _Search, prediction: Prediction) -> None:
    """``prediction`` into the ranked or, over the memory limit, the over-limit list."""
    limit = state.problem.memory_limit
    (state.ranked if limit is None or prediction.max_memory <= limit
     else state.over).append(prediction)


def _rows_memory(state: _Search, chosen: Sequence[Timed], rows: int) -> None:
    """The memory of ``chosen`` (fastest first) until ``rows`` candidates that fit are
    strictly faster than the next: that one and every slower one can then not reach the
    table's first ``rows`` (a tie still gets asked, as its memory may rank it higher)."""
    for timed in chosen:
        faster = sum(1 for p in state.ranked if p.samples_per_second > timed.samples_per_second)
        if faster >= rows:
            return
        if not state.fits(timed.candidate, state.started, simulation=False):
            continue
        _file(state, state.memory(timed))


def _cached_first(state: _Search, chosen: Sequence[Timed]) -> list[Prediction]:
    """The memory of every one of ``chosen``, in its order, asked first of those whose
    shape's analysis the memory model still holds (the search asked it of its bests, whose
    shapes a longer run of other shapes would otherwise push out), then in order: the same
    predictions, fewer shapes analysed twice."""
    held = [i for i, t in enumerate(chosen) if memory_at_hand(t.plan, one_copy=t.one_copy)]
    first = set(held)
    rest = [i for i in range(len(chosen)) if i not in first]
    found = {i: state.memory(chosen[i]) for i in held + rest}
    return [found[i] for i in range(len(chosen))]


def _shape_key(timed: Timed) -> tuple[Any, ...]:
    """What the memory model analyses once per shape (planner/memory_shape.py), then the
    speed: candidates of one shape next to each other."""
    c = timed.candidate
    return (c.schedule, c.depth, c.width, c.chunks, c.pipelines, c.microbatches,
            c.replicas or (), -timed.samples_per_second)


def _result(state: _Search, considered: int) -> SearchResult:
    state.ranked.sort(key=lambda p: (-p.samples_per_second, p.max_memory,
                                     _simplicity(p.candidate), identity(p.candidate)))
    default = _default_prediction(state, state.problem)
    state.progress(
        f"done: {considered} considered, {state.invalid} invalid, "
        f"{state.pruned_time + state.pruned_memory} pruned, {state.simulated} simulated, "
        f"{state.duplicates} duplicates"
        + (f", {state.over_budget} over the time budget" if state.over_budget else ""))
    return SearchResult(problem=state.problem, ranked=tuple(state.ranked),
                        over_limit=tuple(state.over), default=default, considered=considered,
                        invalid=state.invalid, pruned_time=state.pruned_time,
                        pruned_memory=state.pruned_memory, simulated=state.simulated,
                        duplicates=state.duplicates,
                        seconds=time.perf_counter() - state.started,
                        unexamined=state.unexamined, over_budget=state.over_budget,
                        refused_ties=state.refused_ties, tie_reason=state.tie_reason)


SAFE_SCHEDULE = "1f1b"
"""Under ``--time-limit`` candidates of this schedule go first (:func:`_safe_first`)."""


def _safe_first(keyed: list[Keyed], found: Callable[[], bool]) -> Iterator[Keyed]:
    """``keyed`` (best bound first) in the order a time-limited search examines it: until
    ``found()`` (a candidate that fits was ranked), the 1F1B candidates without
    recomputation from the cheapest to examine (the fewest actions,
    :func:`~pipeweave.auto.budget.work_units`), then the best-bound 1F1B candidate recomputing
    every stage; then every candidate not yet given, best bound first.

    In an exact search the order decides only the work (:func:`_cheap_first`, which
    ``search`` uses then); under a time limit it decides what is examined. The best bounds are often schedules that hold more activations (zero bubble: up
    to 2P - 1 micro-batches) and, on a large model, do not fit, and the first candidate is
    examined with no measured rate, so a huge one could spend the whole limit. The cheapest
    candidate of the memory-frugal schedule every pipeline runs that passes the static memory
    check gives the budget its rate (:mod:`pipeweave.auto.budget`) and, usually, a plan that
    fits; the candidates it skipped come back in bound order."""
    given: set[int] = set()
    safe = [(i, e) for i, e in enumerate(keyed) if e.candidate.schedule == SAFE_SCHEDULE]
    seeds = sorted(((i, e) for i, e in safe if e.candidate.recompute == 0),
                   key=lambda item: (work_units(item[1].candidate), item[0]))
    seeds += [next(((i, e) for i, e in safe if e.candidate.recompute >= e.candidate.stages),
                   (-1, keyed[0]))]
    for index, entry in seeds:
        if found():
            break
        if index >= 0 and index not in given:
            given.add(index)
            yield entry
    yield from (entry for index, entry in enumerate(keyed) if index not in given)


CHEAP_UNITS = 1 << 15
"""An exact search first examines, best bound first, the candidates of at most this many
work units (:func:`~pipeweave.auto.budget.work_units`, some 30,000 forwards: well under a
second to build and simulate), then every other one, best bound first (:func:`_cheap_first`)."""


def _cheap_first(keyed: list[Keyed]) -> Iterator[Keyed]:
    """``keyed`` (best bound first) in the order an exact search examines it: the cheap
    candidates (:data:`CHEAP_UNITS`) first, then the rest, each part best bound first.

    Every candidate is still examined, and every pruning is by a true bound against the
    best simulated candidate so far, so the winner is the same as in bound order (up to
    plans of exactly equal time, which the final sort orders by memory, then simplicity);
    the order only decides how much is built and simulated. At planning scale the best
    bounds are 256-stage pipelines of thousands of micro-batches (seconds to build, and
    often over the memory limit), while a good plan of a few hundred thousand actions is
    simulated in milliseconds; its time then prunes the expensive ones by their bounds."""
    yield from (entry for entry in keyed if work_units(entry.candidate) <= CHEAP_UNITS)
    yield from (entry for entry in keyed if work_units(entry.candidate) > CHEAP_UNITS)


def _cannot_beat(samples: float, bound: float, best: float, candidate: Candidate) -> bool:
    if best <= 0 or not get_info(candidate.schedule).synchronous:
        return False
    return bound > 0 and samples / bound <= best


def _simplicity(candidate: Candidate) -> tuple[Any, ...]:
    """Tie-break: fewer features first (no recompute, no APC, one pipeline, one chunk)."""
    return (candidate.recompute, candidate.apc, candidate.tp, candidate.pipelines,
            candidate.chunks,
            candidate.schedule != SAFE_SCHEDULE, candidate.method != "uniform")


def _default_prediction(state: _Search, problem: AutoProblem) -> Prediction | None:
    candidate = default_candidate(problem)
    if problem.batch % candidate.microbatches or candidate.stages > problem.profile.num_blocks:
        return None
    try:
        done, plan, profile = state.complete(candidate)
        return predict(done, profile, problem)
    except ValueError:
        return None


def default_prediction(problem: AutoProblem) -> Prediction | None:
    """The default plan (:func:`default_candidate`) predicted for ``problem``, or ``None``
    where it cannot be built (fewer blocks than ranks, M not dividing the batch)."""
    return _default_prediction(_Search(problem, lambda _text: None), problem)
