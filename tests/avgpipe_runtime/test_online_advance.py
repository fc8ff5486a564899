"""Algorithm 1 at run time: the advance chosen iteration by iteration, on the real runtime.

The iteration time a real run measures depends on the machine, so these tests tell the
controller the *simulated* time of the advance each iteration ran with
(:class:`SimulatedTime`, a deterministic ``time_source``): a slow link (a transfer as long as
four forwards) against none. Everything else is real: the schedules the runtime interprets,
the memory it counts, the numbers it trains. The real-timing demonstration is
benchmarks/avgpipe_advance.py ``--real``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeweave.avgpipe import AdvanceController, run_controller
from pipeweave.avgpipe.simulated import SimulatedTime, advance_probe
from pipeweave.oracle import run_elastic_oracle
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan,
                               launch_local, run_local)
from pipeweave.runtime.advance.options import AdvanceOptions
from pipeweave.runtime.advance.online import OnlineAdvance
from pipeweave.sim import Costs
from pipeweave.testing import merged_parameters, relative_error

P, M, N = 2, 4, 2
SLOW, NONE = 4.0, 0.0  # transfer time of a message, in forwards


def job(comm: float, *, steps: int = 8, memory_limit: float | None = None,
        pipelines: int = N) -> Job:
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(4, P, schedule="avgpipe", microbatches=M, pipelines=pipelines)
    source = SimulatedTime(P, M, Costs.uniform(1.0, 2.0, comm), pipelines=pipelines)
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=8, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory("adam", {"lr": 3e-3}), return_parameters=True,
               advance=AdvanceOptions(memory_limit=memory_limit, samples=1, tolerance=0.0,
                                      time_source=source))


def simulated_choices(comm: float, pipelines: int = N) -> list[int]:
    """The advances the controller tries when driven by the simulator alone."""
    probe = advance_probe(P, M, Costs.uniform(1.0, 2.0, comm), pipelines=pipelines)
    controller = AdvanceController(float("inf"), M - 1, tolerance=0.0)
    history = run_controller(controller, probe, 20)
    return [s.advance for s in history] + [controller.advance]


def test_slow_link_raises_the_advance_and_no_delay_stays_at_1f1b() -> None:
    slow, none = run_local(job(SLOW)), run_local(job(NONE))
    # warm-up at 0, then exactly the simulator-driven controller's path, then settled
    tried = simulated_choices(SLOW)
    assert tried == [0, 1, 2, 3, 2]                       # 40, 40, 35, 35 -> the smallest best
    assert slow[0].advance_per_step == [0] + tried + [2] * (8 - 1 - len(tried))
    assert simulated_choices(NONE) == [0, 1, 2, 0]        # flat: probes, then back to 1F1B
    assert none[0].advance_per_step == [0, 0, 1, 2, 0, 0, 0, 0]
    log = slow[0].advance_log
    assert [e["decision"] for e in log] == ["warmup", "raise", "probe", "raise", "settle"]
    assert log[-1]["reason"] == "reached AFAB (max_advance)"
    # each advance keeps one more micro-batch per pipeline on the first stage: memory grows
    growth = [b["activation_bytes"] - a["activation_bytes"] for a, b in zip(log[1:], log[2:4])]
    assert growth[0] > 0 and growth[0] == growth[1]
    # every rank agrees on the choice; the advance never changes the numbers
    assert all(r.advance_per_step == slow[0].advance_per_step for r in slow)
    fixed = merged_parameters(run_local(dataclasses.replace(job(SLOW), advance=None)))
    for name, value in merged_parameters(slow).items():
        assert torch.equal(value, fixed[name]), name


def test_the_memory_limit_stops_the_climb() -> None:
    free = run_local(job(SLOW))[0].advance_log
    at = {e["advance"]: e["peak_bytes"] for e in free}
    # room for advance 2 but not for 3 (AFAB): stop at 2 without ever exceeding the limit
    limit = (at[2] + at[3]) / 2
    log = run_local(job(SLOW, memory_limit=limit))[0].advance_log
    assert [e["advance"] for e in log] == [0, 0, 1, 2]
    assert log[-1]["decision"] == "settle" and "advance 3 would exceed" in log[-1]["reason"]
    assert max(e["peak_bytes"] for e in log) <= limit


def test_fixed_advances_are_measured_the_same_way() -> None:
    auto = {e["advance"]: e["peak_bytes"] for e in run_local(job(SLOW))[0].advance_log}
    for fixed, advance in ((1, 1), ("all", M - 1)):
        j = job(SLOW, steps=3)
        j = dataclasses.replace(j, advance=dataclasses.replace(j.advance, fixed=fixed))
        result = run_local(j)[0]
        assert result.advance_per_step == [advance] * 3
        assert [e["decision"] for e in result.advance_log] == ["fixed"] * 3
        assert result.advance_log[-1]["peak_bytes"] == auto[advance]
        last = result.advance_log[-1]
        assert max(last["peak_bytes_per_rank"]) == last["peak_bytes"]
        assert max(last["activation_bytes_per_rank"]) == last["activation_bytes"]


def test_numbers_match_the_elastic_oracle() -> None:
    j = job(SLOW, steps=5)
    expected = run_elastic_oracle(spec=j.model(), pipelines=N, steps=j.steps, data=j.data(),
                                  optimizer=j.optimizer)
    params = merged_parameters(run_local(j))
    for name, value in expected.parameters.items():
        assert relative_error(params[name], value) <= 1e-10, name


def test_misuse_is_rejected_before_running() -> None:
    with pytest.raises(ValueError, match="runs schedule 'avgpipe', not '1f1b'"):
        OnlineAdvance(Plan.uniform(4, 2, schedule="1f1b"), 4, AdvanceOptions())
    fixed = Plan.uniform(4, 2, schedule="avgpipe", schedule_options={"advance": 1})
    with pytest.raises(ValueError, match="the plan fixes {'advance': 1}"):
        OnlineAdvance(fixed, 4, AdvanceOptions())
    with pytest.raises(ValueError, match="below what rank"):
        run_local(job(SLOW, memory_limit=1000.0))
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        AdvanceOptions(samples=0)
    with pytest.raises(ValueError, match="memory_limit must be > 0"):
        AdvanceOptions(memory_limit=-1.0)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_distributed_ranks_choose_the_same_advances_as_the_local_run() -> None:
    j = job(SLOW)
    distributed = launch_local(j, deadline_s=200)
    local = run_local(j)
    assert all(r.advance_per_step == local[0].advance_per_step for r in distributed)
    assert [e["decision"] for e in distributed[0].advance_log] == [
        e["decision"] for e in local[0].advance_log]
    # the same memory is counted on both executors (it is counted, not sampled)
    assert [e["peak_bytes"] for e in distributed[0].advance_log] == [
        e["peak_bytes"] for e in local[0].advance_log]
    # and every rank's own numbers travel in the same collective (the tuner reads them)
    for d, l in zip(distributed[0].advance_log, local[0].advance_log):
        assert d["peak_bytes_per_rank"] == l["peak_bytes_per_rank"]
        assert d["activation_bytes_per_rank"] == l["activation_bytes_per_rank"]
        assert max(d["peak_bytes_per_rank"]) == d["peak_bytes"] and len(d["peak_bytes_per_rank"]) == P
    params = merged_parameters(local)
    assert all(torch.equal(params[n], v) for n, v in merged_parameters(distributed).items())
