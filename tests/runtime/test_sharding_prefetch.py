"""A sharded stage's gathers prefetched in the schedule's order (``runtime/execution/gathers.py``,
docs/sharding.md): the plan read from a rank's program, literally; and at ``pp=2,dp=2``
with interleaved 1F1B, every all-gather FSDP2 issues recorded against the actions: each
action's first gather starts before the action (before the other chunk's action that
precedes it, where one does), and without prefetching inside the action itself; the
parameters are bit for bit the same either way."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from pipeweave.cli.cmd_train import add_parser as add_train, build_job
from pipeweave.host import FORKSERVER_PRELOAD
from pipeweave.ir import Op
from pipeweave.runtime import Plan
from pipeweave.runtime.execution.gathers import gather_plan
from pipeweave.runtime.execution.parts import make_schedule
from pipeweave.runtime.launch.prepare import prepare

from runtime_jobs import gpt_job

COMPUTE = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)


def _interleaved(microbatches: int = 8, steps: int = 1):  # type: ignore[no-untyped-def]
    plan = Plan.uniform(6, 2, chunks=2, schedule="interleaved-1f1b", microbatches=microbatches,
                        width=2, shard="full")
    return make_schedule(plan, steps)


def test_plan_of_interleaved_1f1b_rank_1() -> None:
    """``<k``: before action k (it computes on the other chunk), ``>k``: after it (the same
    chunk); the stage and the block the next compute action begins with."""
    program = _interleaved().programs[1]
    assert " ".join(map(str, program[:14])) == (
        "1RF0 1F0@0 1SF0 1RF2 1F2@0 1SF2 3RF0 3F0@0 3B0@0 3SB0 3RF2 3F2@0 3B2@0 3SB2")
    plan = gather_plan(program, {1: False, 3: False})
    assert str(plan).startswith(
        ">1 1:first  <4 3:first  >7 3:last  >8 3:first  >11 3:last  <12 1:first  >15 1:last")
    # recomputing stages begin their backwards with the forward again: the first block
    recomputed = gather_plan(program, {1: True, 3: True})
    assert {f.end for f in recomputed.after.values()} | {
        f.end for f in recomputed.before.values()} == {"first"}


def test_no_gather_across_an_update() -> None:
    """After a stage's update the next iteration's first forward is prefetched after the
    last update (the shards are the new ones), never before it; the first action gets none."""
    schedule = _interleaved(steps=2)
    program = schedule.programs[0]
    plan = gather_plan(program, {0: False, 2: False})
    updates = [p for p, a in enumerate(program) if a.op is Op.STEP]
    first_of_second = next(p for p, a in enumerate(program) if a.op is Op.FORWARD
                           and p > updates[1])
    assert plan.after[updates[1]].stage == program[first_of_second].stage
    for position in plan.before:  # a "before" is always at a compute action
        assert program[position].op in COMPUTE
    assert 0 not in plan.before and min(plan.after) == 0  # 0F0 itself: FSDP2's own gather
    assert str(gather_plan(program, {})) == ""  # nothing sharded, nothing planned


def test_refused_without_sharding() -> None:
    job = gpt_job(depth=2, plan_fields={"width": 2}, prefetch_gathers=False)
    with pytest.raises(ValueError, match="--no-prefetch-gathers without --shard"):
        prepare(job)


def test_cli_flag() -> None:
    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    flags = ["train", "--model", "mlp", "--mesh", "pp=2,dp=2", "--shard", "full"]
    assert build_job(parser.parse_args(flags)).prefetch_gathers
    assert not build_job(parser.parse_args([*flags, "--no-prefetch-gathers"])).prefetch_gathers


# -- the order of the all-gathers in a real pp=2,dp=2 run ----------------------------------

def _recording(events: list[list[Any]], owners: dict[int, list[int]]) -> None:
    """Patch FSDP2 and the interpreter (in this rank's process) to log every all-gather
    issued (``["gather", stage, block]``) and every compute action's start and end."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from pipeweave.runtime.execution import sharding
    from pipeweave.runtime.execution.interpreter import RankInterpreter

    real_unshard, real_shard = FSDPParamGroup.unshard, sharding.shard_stage

    def unshard(self: FSDPParamGroup, async_op: bool = False) -> None:
        fresh = self._all_gather_result is None and not self.is_unsharded
        real_unshard(self, async_op)
        if fresh and self._all_gather_result is not None:
            events.append(["gather", *owners[id(self)]])

    def shard_stage(module: Any, group: Any, mode: str, **options: Any) -> Any:
        found = real_shard(module, group, mode, **options)
        blocks = [m for m in module.children() if isinstance(m, FSDPModule)]
        for index, block in enumerate(blocks):
            for each in fully_shard.state(block)._fsdp_param_groups:  # type: ignore[attr-defined]
                owners[id(each)] = [options["stage"], index, len(blocks)]
        return found

    FSDPParamGroup.unshard = unshard  # type: ignore[method-assign]
    sharding.shard_stage = shard_stage  # type: ignore[assignment]
    for name in ("_forward", "_backward", "_backward_weight"):
        real = getattr(RankInterpreter, name)

        def logged(self: RankInterpreter, action: Any, position: int, real: Any = real) -> Any:
            events.append(["start", position])
            done = real(self, action, position)
            events.append(["end", position])
            return done
        setattr(RankInterpreter, name, logged)


def _rank(rank: int, prepared: Any, store: str, out: str) -> None:
    import torch.distributed as dist

    from pipeweave.runtime.launch.rank import run_rank

    events: list[list[Any]] = []
    _recording(events, {})
    (result,) = run_rank(prepared, rank=rank, world_size=4, local_rank=rank,
                         local_world_size=4, store=dist.FileStore(store, 4))
    Path(out, f"rank{rank}.json").write_text(json.dumps(events))
    torch.save(result.parameters, Path(out, f"rank{rank}.pt"))


def _run(job: Any, folder: Path) -> tuple[list[list[list[Any]]], list[Any]]:
    folder.mkdir()
    # forked by a fork server that imported torch once, as the launcher's ranks are, rather
    # than four fresh interpreters importing it again for each of the two runs
    mp.set_forkserver_preload([*FORKSERVER_PRELOAD, "pipeweave.runtime.launch.rank"])
    mp.start_processes(_rank, args=(prepare(job), str(folder / "store"), str(folder)),
                       nprocs=4, join=True, start_method="forkserver")
    events = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(4)]
    return events, [torch.load(folder / f"rank{r}.pt") for r in range(4)]


def _gathers(events: list[list[Any]], stage: int, block: int, low: int, high: int) -> list[int]:
    """Indices in ``events`` of the gathers of ``stage``'s ``block`` strictly between two."""
    return [i for i in range(low + 1, high)
            if events[i][0] == "gather" and events[i][1:3] == [stage, block]]


def _check_rank(program: Any, events: list[list[Any]], stages: tuple[int, ...],
                prefetched: bool) -> int:
    """Each planned action's first gather: before it (and, planned before the other chunk's
    action, before that one) with prefetching, inside it without; the count of the latter
    kind of early gathers."""
    plan = gather_plan(program, {s: False for s in stages})
    blocks = {e[1]: e[3] for e in events if e[0] == "gather"}
    at = {"start": {}, "end": {}}  # type: dict[str, dict[int, int]]
    for index, event in enumerate(events):
        if event[0] in at:
            at[event[0]][event[1]] = index
    computes = [p for p, a in enumerate(program) if a.op in COMPUTE]
    crossed = 0
    for previous, position in zip([None, *computes], computes):
        action = program[position]
        if previous is None:
            continue
        block = 0 if action.op is Op.FORWARD else blocks[action.stage] - 1  # no recomputation
        start, end = at["start"][position], at["end"][position]
        before = previous in plan.before
        earlier = [p for p in computes if p < previous]
        low = at["end"][earlier[-1]] if before and earlier else (-1 if before else
                                                                 at["end"][previous])
        early = _gathers(events, action.stage, block, low, start)
        if prefetched:
            assert early, (str(action), events[low:start + 1])
            inside = [e[2] for e in events[start:end] if e[0] == "gather" and e[1] == action.stage]
            assert not inside or inside[0] != block, (str(action), inside)  # not gathered again
            if before:
                assert early[0] < at["start"][previous], str(action)
                crossed += 1
        else:  # FSDP2's own order: at the action, inside it
            assert not early and _gathers(events, action.stage, block, start, end), str(action)
    return crossed


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_gathers_start_before_the_action_in_the_schedules_order(tmp_path: Path) -> None:
    job = gpt_job(depth=2, schedule="interleaved-1f1b", chunks=2, steps=2, microbatches=8,
                  plan_fields={"width": 2, "shard": "full"}, timeout_s=300.0)
    early, early_params = _run(job, tmp_path / "prefetch")
    late, late_params = _run(dataclasses.replace(job, prefetch_gathers=False), tmp_path / "not")
    for mine, theirs in zip(early_params, late_params):  # a gather is a copy: bit for bit
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert torch.equal(mine[name], theirs[name]), name
    schedule = prepare(job).schedule
    for rank in range(4):
        program, stages = schedule.programs[rank], schedule.layout.stages_of(rank)
        crossed = _check_rank(program, early[rank], stages, prefetched=True)
        assert crossed >= 8, crossed  # the other chunk's action ran while this gather was out
        _check_rank(program, late[rank], stages, prefetched=False)
