"""Long runs stay flat (issue 24): no registered schedule keeps more tensors as steps go by.

Every registered schedule trains with its defaults as ``pipeweave train`` runs it (activation
counting and the timeline on), P = 2, for warm-up steps and then 30 more. After every optimizer
step (torch's global post-step hook) the test counts the tensors Python can reach and the bytes
of their distinct storages. In the steady state a pipeline repeats itself, so at the same phase
of two steps 30 apart both numbers must be equal (counted at those two points only: a count
walks every object Python tracks). Under the split-backward schedules
each micro-batch's graph used to stay alive through a reference cycle (12 MiB a step); this
test failed then with thousands of extra tensors.

``benchmarks/soak.py`` runs the same for 1,000 steps and reports peak memory.
"""

from __future__ import annotations

import pytest

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.observation.live import live_tensors, live_tensors_between
from pipeweave.schedules import available_schedules, schedule_defaults

WARMUP, MEASURED, TAIL, P = 4, 30, 3, 2
TINY = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 8}


def job(schedule: str, steps: int) -> Job:
    own = schedule_defaults(schedule, P, microbatches=4)
    name, kwargs = own.optimizer
    return Job(plan=Plan.uniform(6, P, chunks=own.chunks, schedule=schedule,
                                 microbatches=own.microbatches),
               steps=steps, model=BuiltinModel("gpt-tiny", overrides=TINY),
               data=BuiltinData("stdlib-bytes", batch_size=2 * own.microbatches, seq_len=8),
               optimizer=OptimizerFactory(name, dict(kwargs)), count_activations=True)


@pytest.mark.parametrize("schedule", [info.name for info in available_schedules()])
def test_live_tensors_do_not_grow_in_the_steady_state(schedule: str) -> None:
    early, late = live_tensors_between(lambda steps: run_local(job(schedule, steps)),
                                       first=WARMUP, second=WARMUP + MEASURED,
                                       total=WARMUP + MEASURED + TAIL)
    assert late == early, (f"{schedule}: {late.tensors - early.tensors} more tensors and "
                           f"{late.storage_bytes - early.storage_bytes} more bytes after "
                           f"{MEASURED} steps")


def test_nothing_outlives_a_run() -> None:
    """What a run held is gone once it returns (zb-h1 with activation counting kept 21,255
    tensors after the run before the fix)."""
    before = live_tensors()
    run_local(job("zb-h1", 6))
    assert live_tensors().tensors <= before.tensors
