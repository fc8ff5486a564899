"""GPU check (issue 25): the runtime's overhead over a plain loop, and every schedule on one GPU.

Run on a machine with one GPU (``scripts/gpu_check.sh`` runs it after the ``cuda`` tests)::

    PYTHONPATH=src python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json]
        [--config benchmarks/gpu/llama550m.json] [--deadline-s 300]
        [--parts plain pipeweave counting profile stages schedules cli cli-local plain-again]

1. **Overhead at one stage.** The 551 M-parameter Llama of ``benchmarks/gpu/llama550m.json``
   (sequence 1024, batch 16 in M = 4 micro-batches, bf16 autocast over float32 weights, fused
   AdamW, lr 3e-4), trained in one process:

   * ``plain loop``: the loop a GPU user writes by hand (written out below, ``plain_step``);
   * ``pipeweave``: ``run_local`` of the same model (``pipeweave.hf`` blocks, whole layers),
     one stage, as ``pipeweave train --device cuda`` runs it (the timeline on, activations not
     counted);
   * ``pipeweave counting``: the same with ``--count-activations`` (a hook per saved tensor;
     not in the default parts).

   Steps are timed the same way for all: a CUDA event after every optimizer step (torch's
   global post-step hook; no host-device synchronisation), the steady state from step 2 on.
   ``ratio_to_plain_loop`` is pipeweave's samples/s over the plain loop's; MFU counts
   6 x parameters x tokens per step against ``--peak-flops``; it is read against the faster
   of two plain-loop runs, one first and one last (``plain-again``), so running first does not
   favour either side. The ``profile`` part (not in the default parts) profiles three
   steady-state steps with ``torch.profiler`` and counts the host-side operations that
   synchronise (``aten::item``, ``cudaStreamSynchronize``, ``cudaMemcpy``, ...) per step.
1b. **The same model at P stages on one GPU** (``stages``): 1F1B at P = 2 and 4, GPipe,
   interleaved 1F1B and ZB-H1 at P = 2, every stage on the one GPU; one device does all the
   compute, so the ratio to one stage is what P stages cost in the runtime.
2. **Every schedule on one GPU.** Each registered schedule trains GPT (d 512, 8 layers,
   sequence 256) on one GPU with ``run_local``, P = 2 stages (its default chunks), M = 8,
   batch 32, Adam: samples/s and its ratio to the same model at one stage (the compute every
   schedule must do; split backward and recomputation cost more, asynchronous ones no flush).
3. ``pipeweave train`` as a user runs it (the CLI, one rank process, and ``--executor local``):
   command to exit, and its steady steps from ``summary.json``'s step ends.

Prints one table; writes the JSON (partial results are written as each part ends).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from pipeweave.runtime import BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.schedules import available_schedules, schedule_defaults

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "benchmarks" / "gpu" / "llama550m.json"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
SEQ, BATCH, M, STEPS, WARM = 1024, 16, 4, 12, 2
SWEEP = {"d_model": 512, "n_layers": 8, "n_heads": 8, "d_ff": 2048, "seq_len": 256}
SWEEP_BATCH, SWEEP_M, SWEEP_STEPS = 32, 8, 8
PARTS = ("plain", "pipeweave", "counting", "profile", "stages", "schedules", "cli", "cli-local",
         "plain-again")
DEFAULT_PARTS = ("plain", "pipeweave", "stages", "schedules", "cli", "cli-local", "plain-again")
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize",
            "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")


class StepClock:
    """A CUDA event after every optimizer step; steps are read at the end (no host sync)."""

    def __init__(self) -> None:
        self.events: list[torch.cuda.Event] = []
        self._handle: Any = None

    def __enter__(self) -> "StepClock":
        def mark(*_: object) -> None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        self._handle = register_optimizer_step_post_hook(mark)
        return self

    def __exit__(self, *_: object) -> None:
        self._handle.remove()
        torch.cuda.synchronize()

    def step_seconds(self, per_step: int, warm: int) -> list[float]:
        """Seconds per training step (``per_step`` optimizer steps each), after ``warm``."""
        ends = self.events[per_step - 1::per_step]
        return [a.elapsed_time(b) / 1e3 for a, b in zip(ends[warm - 1:], ends[warm:])]


def rate(seconds: list[float], batch: int) -> float:
    return batch / statistics.median(seconds)


# -- 1. overhead at one stage -------------------------------------------------------------
def plain_loop(config_file: Path) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_json_file(str(config_file))).cuda().train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    data = torch.randint(0, 256, (BATCH, SEQ + 1), device="cuda")

    def plain_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for micro in data.chunk(M):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(micro[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), micro[:, 1:].flatten())
            (loss / M).backward()
        optimizer.step()

    torch.cuda.reset_peak_memory_stats()
    with StepClock() as clock:
        for _ in range(STEPS):
            plain_step()
    seconds = clock.step_seconds(1, WARM)
    del model, optimizer
    torch.cuda.empty_cache()
    return {"samples_per_second": rate(seconds, BATCH), "parameters": params,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "step_ms": [round(1e3 * s, 2) for s in seconds]}


def pipeweave_job(config_file: Path, *, counting: bool, steps: int = STEPS) -> Job:
    model = BuiltinModel("hf-llama", overrides={"config_file": str(config_file),
                                                "seq_len": SEQ, "sublayer": False})
    layers = json.loads(config_file.read_text())["num_hidden_layers"]
    blocks = layers + 2  # embedding, the decoder layers, the head (not built here to count)
    return Job(plan=Plan.uniform(blocks, 1, schedule="1f1b", microbatches=M), steps=steps,
               model=model, data=model.data(BATCH, seq_len=SEQ), device="cuda",
               optimizer=OptimizerFactory("adamw", {"lr": 3e-4}), precision="bf16-mixed",
               count_activations=counting)


def pipeweave_run(config_file: Path, *, counting: bool) -> dict[str, Any]:
    torch.cuda.reset_peak_memory_stats()
    with StepClock() as clock:
        run_local(pipeweave_job(config_file, counting=counting))
    seconds = clock.step_seconds(1, WARM)
    torch.cuda.empty_cache()
    return {"samples_per_second": rate(seconds, BATCH),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "step_ms": [round(1e3 * s, 2) for s in seconds]}


def profiled(config_file: Path, out: Path) -> dict[str, Any]:
    """Host operations that synchronise, per step, over steps 3..5 of a ``pipeweave`` run."""
    from torch.profiler import ProfilerActivity, profile, schedule

    active, captured = 3, []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=active, repeat=1),
                 on_trace_ready=lambda done: captured.append(done.key_averages())) as prof:
        handle = register_optimizer_step_post_hook(lambda *_: prof.step())
        try:
            run_local(pipeweave_job(config_file, counting=False, steps=active + 3))
        finally:
            handle.remove()
    averages = captured[0]
    counts = {e.key: e.count / active for e in averages if e.key in SYNC_OPS}
    table = averages.table(sort_by="self_cpu_time_total", row_limit=40)
    (out.parent / "gpu_check_profile.txt").write_text(table)
    return {"sync_calls_per_step": counts,
            "self_cpu_ms_per_step": sum(e.self_cpu_time_total for e in averages) / active / 1e3,
            "self_cuda_ms_per_step": sum(e.self_device_time_total for e in averages)
            / active / 1e3}


# -- 1b. the large model at P stages on one GPU -------------------------------------------------
STAGE_RUNS = (("1f1b", 2), ("1f1b", 4), ("gpipe", 2), ("interleaved-1f1b", 2), ("zb-h1", 2))
STAGE_STEPS = 8


def stages_run(config_file: Path, one_stage: float | None) -> list[dict[str, Any]]:
    """The 551 M Llama split into P stages, every stage on the one GPU (``run_local``): one
    device does all the compute, so the iteration should take what one stage takes; the ratio
    to one stage is the runtime's cost of P stages (the bubble a schedule has on P devices is
    not idle time here). Same settings as the one-stage run, fewer steps."""
    rows: list[dict[str, Any]] = []
    layers = json.loads(config_file.read_text())["num_hidden_layers"]
    for schedule, stages in STAGE_RUNS:
        row: dict[str, Any] = {"schedule": schedule, "stages": stages}
        try:
            own = schedule_defaults(schedule, stages, microbatches=M, chunks=None)
            job = dataclasses.replace(
                pipeweave_job(config_file, counting=False, steps=STAGE_STEPS),
                plan=Plan.uniform(layers + 2, stages, chunks=own.chunks, schedule=schedule,
                                  microbatches=M))
            torch.cuda.reset_peak_memory_stats()
            with StepClock() as clock:
                run_local(job)
            per_step = len(clock.events) // STAGE_STEPS
            row["samples_per_second"] = rate(clock.step_seconds(per_step, WARM), BATCH)
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            if one_stage:
                row["ratio_to_one_stage"] = row["samples_per_second"] / one_stage
        except Exception as error:  # noqa: BLE001 - a failing run is a row, not the end
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[-1][:200]}"
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"  {row}", flush=True)
    return rows


# -- 2. every schedule on one GPU ------------------------------------------------------------
def sweep_job(schedule: str, stages: int) -> Job:
    own = schedule_defaults(schedule, stages, microbatches=SWEEP_M,
                            chunks=None if stages > 1 else 1, optimizer=("adam", {"lr": 1e-4}))
    name, kwargs = own.optimizer
    model = BuiltinModel("gpt-small", overrides=dict(SWEEP))
    blocks = len(model().blocks)
    return Job(plan=Plan.uniform(blocks, stages, chunks=own.chunks, schedule=schedule,
                                 microbatches=own.microbatches),
               steps=SWEEP_STEPS, model=model, data=model.data(SWEEP_BATCH), device="cuda",
               optimizer=OptimizerFactory(name, dict(kwargs)), record_timeline=False)


def sweep(deadline: float) -> list[dict[str, Any]]:
    """The one-stage baseline first, then every registered schedule at P = 2."""
    rows: list[dict[str, Any]] = []
    baseline: float | None = None
    for index, schedule in enumerate(["1f1b", *[i.name for i in available_schedules()]]):
        stages = 1 if index == 0 else 2
        row: dict[str, Any] = {"schedule": schedule if index else "1f1b (1 stage)",
                               "stages": stages}
        if time.time() > deadline:
            rows.append({**row, "error": "not run: deadline"})
            continue
        started = time.time()
        try:
            with StepClock() as clock:
                run_local(sweep_job(schedule, stages))
            per_step = len(clock.events) // SWEEP_STEPS
            row["samples_per_second"] = rate(clock.step_seconds(per_step, WARM), SWEEP_BATCH)
            row["wall_s"] = round(time.time() - started, 1)
        except Exception as error:  # noqa: BLE001 - a failing schedule is a row, not the end
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[-1][:200]}"
        if index == 0:
            baseline = row.get("samples_per_second")
        elif baseline and "samples_per_second" in row:
            row["ratio_to_one_stage"] = row["samples_per_second"] / baseline
        rows.append(row)
        print(f"  {row}", flush=True)
    return rows


# -- 3. the command line ---------------------------------------------------------------------
def command_line(config_file: Path, executor: str = "processes") -> dict[str, Any]:
    """``pipeweave train`` at one stage as a user runs it: wall time, its own samples/s."""
    folder = Path(tempfile.mkdtemp(prefix=f"gpu_check_train_{executor}_"))  # not beside out
    command = [sys.executable, "-m", "pipeweave", "train", "--hf-config", str(config_file),
               "--device", "cuda", "--stages", "1", "--microbatches", str(M),
               "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--precision", "bf16-mixed",
               "--optimizer", "adamw", "--lr", "3e-4", "--steps", str(STEPS), "--no-progress",
               "--output-dir", str(folder), "--executor", executor]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    wall = time.time() - started
    result: dict[str, Any] = {"command": " ".join(command[1:]), "exit_code": done.returncode,
                              "wall_s": round(wall, 1),
                              "stderr_tail": done.stderr.strip().splitlines()[-5:]}
    summary_file = folder / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        result["samples_per_second"] = summary["samples_per_second"]
        result["train_seconds"] = summary["wall_seconds"]
        ends = summary.get("iteration_end_s") or []
        steps = [b - a for a, b in zip(ends[WARM - 1:], ends[WARM:])]
        if steps:  # the steady state, as the in-process parts are read
            result["steady_samples_per_second"] = rate(steps, BATCH)
            result["step_ms"] = [round(1e3 * s, 2) for s in steps]
    return result


# -- the report ------------------------------------------------------------------------------
def timed(name: str, work: Callable[[], Any], *, results: dict[str, Any], out: Path) -> None:
    began = time.time()
    try:
        results[name] = work()
    except Exception as error:  # noqa: BLE001 - one failing part must not lose the others
        results[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
    results.setdefault("part_seconds", {})[name] = round(time.time() - began, 1)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{name}: {json.dumps(results[name])[:400]}", flush=True)


def table(results: dict[str, Any]) -> str:
    lines = ["part                          samples/s   ratio   peak GiB   MFU"]
    plain = results.get("plain_loop", {}).get("samples_per_second")
    params = results.get("plain_loop", {}).get("parameters", 0)
    for name in ("plain_loop", "pipeweave", "pipeweave_counting", "plain_loop_again"):
        row = results.get(name, {})
        if "samples_per_second" not in row:
            if "error" in row:
                lines.append(f"{name:<29} {row['error']}")
            continue
        speed = row["samples_per_second"]
        mfu = speed * 6 * params * SEQ / results["peak_flops"] if params else float("nan")
        ratio = speed / plain if plain else float("nan")
        lines.append(f"{name:<29} {speed:>9.2f} {ratio:>7.3f} "
                     f"{row['peak_allocated_bytes'] / 2**30:>10.1f} {mfu:>5.3f}")
    for row in results.get("stages", []):
        speed = row.get("samples_per_second")
        label = f"llama {row['schedule']} P={row['stages']}"
        text = (f"{speed:>9.2f} {row.get('ratio_to_one_stage', float('nan')):>7.3f} "
                f"{row['peak_allocated_bytes'] / 2**30:>10.1f}" if speed else row.get("error", ""))
        lines.append(f"  {label:<27} {text}")
    for row in results.get("schedules", []):
        speed = row.get("samples_per_second")
        text = (f"{speed:>9.1f} {row.get('ratio_to_one_stage', 1.0):>7.3f}" if speed
                else row.get("error", ""))
        lines.append(f"  {row['schedule']:<27} {text}")
    for key, label in (("command_line", "train (processes)"), ("command_line_local",
                                                            "train --executor local")):
        cli = results.get(key, {})
        if cli:
            lines.append(f"pipeweave {label:<23} {cli.get('samples_per_second', 0):>9.2f}   "
                         f"steady {cli.get('steady_samples_per_second', 0):.2f}, "
                         f"exit {cli.get('exit_code')} in {cli.get('wall_s')} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--deadline-s", type=float, default=300.0,
                        help="stop starting schedules of the sweep after this many seconds")
    parser.add_argument("--peak-flops", type=float, default=989e12,
                        help="dense bf16 peak of the card (H100 SXM: 989e12)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS),
                        help="what to run, in this order (plain-again: the plain loop once more "
                             "at the end, to see what running first does to it)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA device: run this on a machine with a GPU")
    began = time.time()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "peak_flops": args.peak_flops,
                               "settings": {"seq_len": SEQ, "batch": BATCH, "microbatches": M,
                                            "steps": STEPS, "warm_steps": WARM,
                                            "sweep_model": SWEEP, "sweep_batch": SWEEP_BATCH,
                                            "sweep_microbatches": SWEEP_M}}
    work: dict[str, tuple[str, Callable[[], Any]]] = {
        "plain": ("plain_loop", lambda: plain_loop(args.config)),
        "pipeweave": ("pipeweave", lambda: pipeweave_run(args.config, counting=False)),
        "counting": ("pipeweave_counting", lambda: pipeweave_run(args.config, counting=True)),
        "profile": ("profile", lambda: profiled(args.config, args.out)),
        "stages": ("stages", lambda: stages_run(
            args.config, results.get("pipeweave", {}).get("samples_per_second"))),
        "schedules": ("schedules", lambda: sweep(began + args.deadline_s)),
        "cli": ("command_line", lambda: command_line(args.config)),
        "cli-local": ("command_line_local",
                      lambda: command_line(args.config, executor="local")),
        "plain-again": ("plain_loop_again", lambda: plain_loop(args.config)),
    }
    for part in args.parts:
        timed(*work[part], results=results, out=args.out)
        plain = max((results.get(key, {}).get("samples_per_second") or 0.0)
                    for key in ("plain_loop", "plain_loop_again"))
        if plain and "samples_per_second" in results.get("pipeweave", {}):
            # against the faster of the two plain-loop runs (one before, one after)
            results["ratio_to_plain_loop"] = results["pipeweave"]["samples_per_second"] / plain
    results["total_seconds"] = round(time.time() - began, 1)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
