"""Replicated stages (PipeDream 1F1B-RR) and data-parallel width under asynchronous semantics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_jobs import gpt_job  # noqa: E402

from pipeweave.runtime import launch_local, run_local
from pipeweave.runtime.observation.summary import iteration_losses
from pipeweave.testing import merged_parameters

CASES = [
    ("pipedream", {"replicas": (2, 1)}, {0: 2, 1: 1}),
    ("pipedream", {"replicas": (1, 2)}, {0: 3, 1: 1}),
    ("2bw", {"replicas": (2, 1)}, {0: 2, 1: 2}),
    ("pipeoptim", {"replicas": (2, 1)}, {0: 2, 1: 1}),
    ("wpipe", {"width": 2}, {0: 2, 1: 2, 2: 1, 3: 1}),
]


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("schedule", "fields", "versions"), CASES,
                         ids=[f"{c[0]}-{list(c[1].values())[0]}" for c in CASES])
def test_replicated_runs_agree_and_hold_expected_versions(schedule, fields, versions) -> None:
    job = gpt_job(depth=2, schedule=schedule, steps=4, chunks=2 if schedule == "wpipe" else 1,
                  plan_fields=fields)
    local, distributed = run_local(job), launch_local(job, deadline_s=280)
    a, b = merged_parameters(local), merged_parameters(distributed)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    measured = {s: v for r in distributed for s, v in r.peak_weight_versions.items()}
    assert measured == versions
    losses = iteration_losses(distributed, 4)
    assert losses[-1] < losses[0]
