"""``auto`` searches tensor parallelism (``tp``) with ``pp x dp x shard``: one search per size
on its own problem (auto/tensor_parallel.py: the profile as one process sees it, tp inside
the topology's fastest level). The costs are checked by hand against the ring all-reduce,
the pruned search picks the exhaustive winner, and under a memory limit only splitting
the layers meets, auto splits them."""

from __future__ import annotations

import dataclasses
import importlib
import random
from pathlib import Path

import pytest

from pipeweave.auto import AutoProblem, enumerate_candidates, search
from pipeweave.auto.predict import candidate_costs, predict
from pipeweave.auto.tensor_parallel import tp_problem, tp_refusal
from pipeweave.planner import Plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.topology import Topology
from pipeweave.planner.tp_costs import ring_allreduce_time
from pipeweave.profiler import BlockProfile, LinkProfile, Profile, TieProfile

from test_pruning_exact import _exhaustive

search_module = importlib.import_module("pipeweave.auto.search")


def _profile(seed: int, blocks: int = 6) -> Profile:
    """Transformer-like blocks: most parameters and activations split, two all-reduces of
    the output per forward and per backward; the first and last blocks replicated."""
    rng = random.Random(seed)

    def block(i: int) -> BlockProfile:
        params, saved = rng.uniform(1, 4) * 1e6, rng.uniform(1, 4) * 1e6
        split = 0 < i < blocks - 1
        return BlockProfile(f"b{i}", forward=rng.uniform(1e-3, 4e-3),
                            backward=rng.uniform(2e-3, 8e-3), output_bytes=2e5,
                            activation_bytes=saved, parameter_bytes=params,
                            optimizer_bytes=2 * params, update=rng.uniform(0, 5e-4),
                            tp_split_parameter_bytes=0.95 * params if split else 0.0,
                            tp_split_activation_bytes=0.8 * saved if split else 0.0,
                            tp_forward_reduces=2 if split else 0,
                            tp_backward_reduces=2 if split else 0)
    return Profile(tuple(block(i) for i in range(blocks)), model="toy", batch_size=2,
                   device="synthetic", source="synthetic", link=LinkProfile(1e9, 1e-5))


def _problem(seed: int = 0, limit: float | None = None, **extra: object) -> AutoProblem:
    extra.setdefault("schedules", ("1f1b", "gpipe", "zb-h1"))
    extra.setdefault("topology", Topology.parse("2x4e9,2x1e9"))
    return AutoProblem(profile=_profile(seed), ranks=4, memory_limit=limit,
                       methods=("uniform", "time"), tp=(1, 2), **extra)  # type: ignore[arg-type]


def test_tp_sits_inside_the_fastest_level() -> None:
    problem = _problem()
    two = tp_problem(problem, 2)
    assert two.ranks == 2 and str(two.topology) == "1x4e+09,2x1e+09"
    assert two.profile.metadata["tp"] == 2 and two.batch == problem.batch
    assert {c.tp for c in enumerate_candidates(two)} == {2}
    assert {c.tp for c in enumerate_candidates(problem)} == {1}
    # 4 does not fit in a level of 2 workers; a profile without the split is not searched
    assert "fastest level" in (tp_refusal(problem, 4) or "")
    bare = Profile(tuple(dataclasses.replace(b, tp_split_parameter_bytes=0.0,
                                             tp_split_activation_bytes=0.0)
                         for b in problem.profile.blocks), model="toy", batch_size=2)
    assert "records no tensor-parallel split" in (
        tp_refusal(dataclasses.replace(problem, profile=bare), 2) or "")
    tied = dataclasses.replace(problem.profile, ties=(TieProfile((0, 5), 1e5),))
    assert "tied" in (tp_refusal(dataclasses.replace(problem, profile=tied), 2) or "")
    with pytest.raises(ValueError, match="fastest level"):
        search(dataclasses.replace(problem, tp=(4,)))
    # ranks sharing 4 CPU cores: a tp=2 pipeline rank computes on 2 of them, so the two
    # pipeline ranks share 2 groups; on 1 core tp=2 could not compute at once
    assert tp_problem(dataclasses.replace(problem, shared_cores=4), 2).shared_cores == 2
    assert "could not compute at once" in (
        tp_refusal(dataclasses.replace(problem, shared_cores=1), 2) or "")


def test_tp_costs_by_hand() -> None:
    """A tp=2 candidate's stage costs: the whole profile's compute / 2 on split blocks, plus
    two ring all-reduces of the output per F and per B, at the fastest level's bandwidth and
    the link's latency."""
    problem = tp_problem(_problem(), 2)
    state = search_module._Search(problem, lambda _text: None)
    candidate = next(c for c in enumerate_candidates(problem)
                     if c.schedule == "1f1b" and c.depth == 2 and c.method == "uniform"
                     and c.microbatches == problem.batch // 2)  # the profile's micro-batch
    done, plan, profile = state.complete(candidate)
    assert plan.tp == 2
    costs = candidate_costs(done, plan, profile, problem)
    whole = _profile(0).blocks
    reduce = 4 * 1 * 2e5 / (2 * 4e9) + 2 * 1e-5
    assert reduce == pytest.approx(ring_allreduce_time(2e5, 2, 4e9, 1e-5))
    for s, (a, e) in enumerate(plan.stages):
        expected = sum(b.forward / 2 + 2 * reduce if b.tp_split_parameter_bytes else b.forward
                       for b in whole[a:e])
        assert costs.forward[s] == pytest.approx(expected)
        expected = sum(b.backward / 2 + 2 * reduce if b.tp_split_parameter_bytes
                       else b.backward for b in whole[a:e])
        assert costs.backward[s] == pytest.approx(expected)


@pytest.mark.parametrize("seed, limit", [(0, None), (1, "loose"), (2, "split only")])
def test_the_pruned_search_picks_the_exhaustive_winner(
        seed: int, limit: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _problem(seed)
    if limit is not None:
        whole, split = _least(problem, 1), _least(problem, 2)
        problem = dataclasses.replace(problem, memory_limit=(
            1.1 * whole if limit == "loose" else (whole + split) / 2))
    pruned = search(problem)
    every = _exhaustive(problem, monkeypatch)
    assert pruned.pruned > 0
    assert {p.candidate.tp for p in every.ranked} == ({2} if limit == "split only" else {1, 2})
    best = every.winner.iteration_time
    assert pruned.winner.iteration_time == pytest.approx(best, rel=1e-12)
    tied = [p for p in every.ranked if p.iteration_time == pytest.approx(best, rel=1e-12)]
    assert any(p.candidate == pruned.winner.candidate for p in tied)


def _least(problem: AutoProblem, tp: int) -> float:
    """The least predicted peak of any candidate of size ``tp`` (every axis a memory limit
    opens: recomputation prefixes, sharding)."""
    sized = tp_problem(dataclasses.replace(problem, memory_limit=1e15), tp)
    state = search_module._Search(sized, lambda _text: None)
    least = float("inf")
    for candidate in enumerate_candidates(sized):
        if not search_module._valid_shape(candidate, sized):
            continue
        try:
            done, _, profile = state.complete(candidate)
            least = min(least, predict(done, profile, sized).max_memory)
        except ValueError:
            continue
    return least


def test_under_a_limit_only_splitting_meets_auto_splits() -> None:
    problem = _problem(3, shard=("none",))
    least_whole, least_split = _least(problem, 1), _least(problem, 2)
    assert least_split < least_whole
    limit = (least_split + least_whole) / 2
    result = search(dataclasses.replace(problem, memory_limit=limit))
    winner = result.winner
    assert winner.candidate.tp == 2 and winner.plan.tp == 2
    assert winner.max_memory <= limit
    # the search's memory is the memory model's for the plan it writes, whole profile given
    ranks = predicted_memory(result.problem.profile, winner.plan,
                             batch_size=result.problem.batch)
    assert list(winner.peak_memory_bytes) == pytest.approx([r.total for r in ranks], rel=1e-9)
    assert winner.candidate.training() == "exact"
    with pytest.raises(ValueError, match="memory"):
        search(dataclasses.replace(problem, memory_limit=limit, tp=(1,))).winner


def test_the_cli_offers_the_sizes_the_runtime_splits() -> None:
    from pipeweave.cli.auto_tp import auto_tp_sizes

    def sizes(text: str | None, model: str | None = "gpt-tiny", limited: bool = False
              ) -> tuple[int, ...] | None:
        return auto_tp_sizes(text, model=model, overrides={}, ranks=8, limited=limited)

    assert sizes(None) is None  # 1 only without a memory limit
    assert sizes(None, limited=True) == (1, 2, 4)  # gpt-tiny: 4 heads; 8 does not divide them
    assert sizes("auto") == (1, 2, 4)
    assert sizes("1,2") == (1, 2)
    assert sizes("auto", model=None) is None  # a profile only: nothing to check against
    with pytest.raises(ValueError, match="does not divide the 4 attention heads"):
        sizes("8")
    with pytest.raises(ValueError, match="only the built-in GPT"):
        sizes("2", model="mlp")
    assert sizes("auto", model="mlp") == (1,)  # offered: none but 1


def test_auto_writes_a_tp_plan(tmp_path: Path) -> None:
    from pipeweave.cli.main import main

    problem = _problem(3, shard=("none",))
    limit = (_least(problem, 1) + _least(problem, 2)) / 2
    path = tmp_path / "profile.json"
    problem.profile.save(path)
    out = tmp_path / "plan.json"
    argv = ["auto", "--profile", str(path), "--ranks", "4", "--topology", "2x4e9,2x1e9",
            "--schedules", "1f1b,gpipe,zb-h1", "--methods", "uniform,time", "--shard", "none",
            "--memory-limit", f"{limit:.0f}", "--tp", "1,2", "--shared-cores", "none",
            "--out", str(out), "--plot", str(tmp_path / "p.png"), "--json"]
    assert main(argv) == 0
    assert Plan.load(out).tp == 2
