"""Ranking stability (issue 29 item 2): two searches of the same profile pick the same plan
and rank the table alike, in one process and in two processes with different string hashes;
equal predictions are ordered by the candidates' identity (auto/ranking.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, Candidate, search
from pipeweave.auto.ranking import identity
from pipeweave.profiler import LinkProfile, Profile

SRC = Path(__file__).resolve().parents[2] / "src"


def _plans(problem: AutoProblem) -> list[str]:
    result = search(problem)
    return [json.dumps(p.plan.to_json(), sort_keys=True) for p in result.ranked]


@pytest.mark.parametrize("ranks", [2, 4])
def test_two_searches_of_one_profile_rank_alike(ranks: int) -> None:
    problem = AutoProblem(profile=small_profile(3, blocks=8, link=LinkProfile(1e9, 1e-5)),
                          ranks=ranks)
    first, second = _plans(problem), _plans(problem)
    assert first and first == second


def _cli_winner(tmp_path: Path, seed: str) -> tuple[str, list[str]]:
    out = tmp_path / seed
    out.mkdir()
    command = [sys.executable, "-m", "pipeweave", "auto", "--profile",
               str(tmp_path / "profile.json"), "--ranks", "2", "--json", "--top", "5",
               "--out", str(out / "plan.json"), "--plot", str(out / "front.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": seed})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return (json.dumps(report["winner"]["plan"], sort_keys=True),
            [json.dumps(row["plan"], sort_keys=True) for row in report["table"]])


@pytest.mark.timeout(600)
def test_two_processes_with_other_string_hashes_pick_the_same_plan(tmp_path: Path) -> None:
    profile = small_profile(11, blocks=10, link=LinkProfile(1e9, 1e-5))
    Profile(profile.blocks, model="toy", batch_size=2, device="synthetic", source="synthetic",
            link=profile.link).save(tmp_path / "profile.json")
    assert _cli_winner(tmp_path, "1") == _cli_winner(tmp_path, "2")


def test_equal_candidates_are_ordered_by_what_they_are() -> None:
    """Candidates that tie on time, memory and simplicity: their order after the sort is the
    same whatever order they came in, and distinct candidates have distinct identities."""
    base = Candidate(schedule="1f1b", method="uniform", depth=2, width=1, chunks=1,
                     pipelines=1, microbatches=4, recompute=0, apc=False,
                     bounds=((0, 3), (3, 6)))
    tied = [base, replace(base, method="time"), replace(base, microbatches=8),
            replace(base, bounds=((0, 2), (2, 6))), replace(base, options={"k": 1})]
    assert len({identity(c) for c in tied}) == len(tied)
    orders = set()
    for seed in range(5):
        shuffled = list(tied)
        random.Random(seed).shuffle(shuffled)
        orders.add(tuple(identity(c) for c in sorted(shuffled, key=identity)))
    assert len(orders) == 1
