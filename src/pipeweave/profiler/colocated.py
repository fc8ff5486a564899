"""Measure what ranks sharing this machine's cores cost each other, beyond sharing them.

Ranks launched as processes on a CPU machine with fewer cores than ranks share the cores; the
simulator models that sharing itself (``Costs(shared_cores=...)``,
:mod:`pipeweave.sim.shared_cores`): while ``n`` ranks compute on ``c`` cores each runs at
``c / n`` of its speed, and at full speed when it computes alone. What the model cannot know
is what sharing costs on top of the ideal split: context switches, caches and memory bandwidth
shared among more processes. ``colocated_load`` starts ``ranks - 1`` neighbour processes that
train the same model on the same micro-batch sizes with the same intra-op threads (one forward
and backward after another, as a pipeline rank in its steady state);
``profile_builtin(colocated_ranks=R)`` times whole training steps alone and under that load:
the ratio is ``colocated_slowdown`` (2.12 for 4 ranks of gpt-small on 2 cores, 0.98–1.0 for
2), and ``sharing_overhead`` divides out the ideal split (``R / cores`` when the ranks
outnumber the cores): 2.12 / 2 = 1.06. The planner multiplies the profiled compute times by
that overhead when it simulates shared cores. ``needed_colocation`` says when it matters.

Several micro-batch sizes (``pipeweave auto`` profiles four) are timed interleaved
(:func:`colocated_slowdowns`): alone, rounds of one step of every size in turn
(:func:`~pipeweave.profiler.rounds.interleaved_rounds`, the block profiler's loop); then
under one set of neighbours, each training every size in turn, the same rounds. A load that
comes or goes while they are timed slows every size alike, and the neighbours start once,
not once per size (before: each size alone, then under neighbours started for that size, one
size after the other).

The neighbours are plain subprocesses (``python -m pipeweave.profiler.colocated``, so any
caller works, with or without a ``__main__`` guard); they are stopped when the ``with`` block
ends, killed if they do not stop, and each one exits on its own when its parent is gone, so a
failed or killed profile never leaves them running.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from functools import partial
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..models import ModelSpec
from ..host import machine_cores
from .rounds import interleaved_rounds

__all__ = ["colocated_load", "colocated_slowdowns", "needed_colocation", "sharing_overhead"]

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
READY = "ready"
STEP_SECONDS = 1.5
"""How long whole training steps of each size are timed, alone and under the co-located
load (the sizes' rounds together last this times the sizes)."""


def needed_colocation(ranks: int, device: str = "cpu") -> int:
    """Ranks to profile under: ``ranks`` when they oversubscribe this machine's cores on CPU,
    else 1 (each rank has a core or a GPU of its own)."""
    if device != "cpu" or ranks <= machine_cores():
        return 1
    return ranks


def sharing_overhead(slowdown: float, ranks: int, cores: int) -> float:
    """What ``ranks`` processes sharing ``cores`` cores cost beyond the ideal split: the
    measured whole-step ``slowdown`` over ``max(1, ranks / cores)``, at least 1 (sharing never
    speeds a rank up; a ratio a little under 1 is timing noise)."""
    if ranks < 1 or cores < 1:
        raise ValueError(f"ranks and cores must be >= 1, got ranks={ranks}, cores={cores}")
    return max(1.0, slowdown / max(1.0, ranks / cores))


@contextmanager
def colocated_load(model: str, *, ranks: int, batch_sizes: Sequence[int],
                   seq_len: int | None = None, overrides: dict[str, Any] | None = None,
                   threads: int = 1, seed: int = 0) -> Iterator[int]:
    """Run ``ranks - 1`` neighbours training ``model`` while the body runs, each one step of
    every micro-batch size of ``batch_sizes`` in turn; yields their count.

    Each neighbour has done one whole forward and backward of every size before the body
    starts, so the body never measures their start-up.
    """
    if ranks < 1:
        raise ValueError(f"colocated ranks must be >= 1 (the profiled rank included), got {ranks}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    count = ranks - 1
    if count == 0:
        yield 0
        return
    workers: list[subprocess.Popen[str]] = []
    try:
        for i in range(count):
            settings = {"model": model, "batch_sizes": list(batch_sizes), "seq_len": seq_len,
                        "overrides": dict(overrides or {}), "threads": threads,
                        "seed": seed + 1 + i, "parent": os.getpid()}
            workers.append(subprocess.Popen(
                [sys.executable, "-m", __name__, json.dumps(settings)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for index, worker in enumerate(workers):
            _wait_ready(worker, index, deadline)
        yield count
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(STOP_TIMEOUT_S)
            if worker.stdout is not None:
                worker.stdout.close()


def colocated_slowdowns(spec: ModelSpec, batches: Sequence[tuple[Tensor, Tensor | None]], *,
                        ranks: int, batch_sizes: Sequence[int], seq_len: int | None = None,
                        overrides: dict[str, Any] | None = None, threads: int = 1,
                        seed: int = 0) -> tuple[float, ...]:
    """Per ``(inputs, targets)`` of ``batches`` (one per micro-batch size of ``batch_sizes``):
    the mean whole-step time of ``spec`` under ``ranks - 1`` neighbours over the time alone,
    the sizes' steps interleaved (module docstring).

    Whole steps span many scheduler time slices, so the ratio carries the time this rank is
    descheduled, which the median of a single block's short runs would filter out.
    """
    alone = _mean_step_times(spec, batches, threads)
    with colocated_load(spec.name, ranks=ranks, batch_sizes=batch_sizes, seq_len=seq_len,
                        overrides=overrides, threads=threads, seed=seed):
        shared = _mean_step_times(spec, batches, threads)
    return tuple(s / a for s, a in zip(shared, alone))


def _train_step(spec: ModelSpec, network: nn.Module, inputs: Tensor, targets: Tensor | None) -> None:
    """Forward, loss (the output's sum without targets) and backward; gradients dropped."""
    output = network(inputs)
    loss = spec.loss_fn(output, targets) if targets is not None else output.sum()
    loss.backward()
    network.zero_grad(set_to_none=True)


def _mean_step_times(spec: ModelSpec, batches: Sequence[tuple[Tensor, Tensor | None]],
                     threads: int) -> list[float]:
    """Per batch, the mean wall time of one whole training step, the batches' steps in
    interleaved rounds (a warm-up round first) over about STEP_SECONDS per batch (3 rounds at
    least)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        network = spec.sequential().train()
        window: list[float] = []  # when the timed rounds began, after the warm-up round

        def step(inputs: Tensor, targets: Tensor | None) -> float:
            begun = time.perf_counter()
            _train_step(spec, network, inputs, targets)
            return time.perf_counter() - begun

        def more(done: int, _: Sequence[Sequence[float]]) -> bool:
            if done == 1:
                window.append(time.perf_counter())
            return done < 4 or time.perf_counter() - window[0] < STEP_SECONDS * len(batches)

        steps = interleaved_rounds([partial(step, x, y) for x, y in batches], warmup=1,
                                   more=more)
        return [sum(times) / len(times) for times in steps]
    finally:
        torch.set_num_threads(previous)


def _wait_ready(worker: subprocess.Popen[str], index: int, deadline: float) -> None:
    assert worker.stdout is not None
    while True:
        readable, _, _ = select.select([worker.stdout], [], [], 0.05)
        if readable and worker.stdout.readline().strip() == READY:
            return
        if worker.poll() is not None:
            raise RuntimeError(f"co-located neighbour {index} exited with code {worker.returncode} "
                               f"before the profile ran (its error is printed above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"co-located neighbour {index} did not start training within "
                               f"{READY_TIMEOUT_S:.0f} s; profile with fewer --colocated-ranks")


def _neighbour(settings: dict[str, Any]) -> None:
    """Train forever (a pipeline rank's steady state); say READY after the first step; exit
    when the parent is gone."""
    from ..data import build_dataset
    from ..models import build_model

    torch.set_num_threads(int(settings["threads"]))
    spec = build_model(settings["model"], seed=settings["seed"], **settings["overrides"])
    batches = [next(iter(build_dataset(spec.dataset or "digits", batch_size=size,
                                       seq_len=settings["seq_len"], seed=settings["seed"])))
               for size in settings["batch_sizes"]]
    network = spec.sequential()
    announced = False
    while os.getppid() == settings["parent"]:
        for inputs, targets in batches:
            _train_step(spec, network, inputs, targets)
        if not announced:
            print(READY, flush=True)
            announced = True


if __name__ == "__main__":
    _neighbour(json.loads(sys.argv[1]))
