"""Run by ``test_host_memory_per_stage.py`` in a fresh interpreter (a clean peak RSS): a tiny GPT and
a 405 MB GPT (float32) trained one step on 4 ranks; prints the launcher's and every rank's
peak RSS and every stage's parameter bytes as JSON."""

from __future__ import annotations

import json
from typing import Any

from pipeweave.runtime import BuiltinModel, Job, OptimizerFactory, Plan, launch_local

BIG = {"d_model": 1024, "d_ff": 4096, "n_heads": 8, "n_layers": 8}
"""101 M parameters: 405 MB of float32 weights."""


def _launcher_peak() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run(overrides: dict[str, Any]) -> dict[str, Any]:
    model = BuiltinModel("gpt-tiny", overrides={**overrides, "seq_len": 16})
    spec = model()  # on the meta device
    plan = Plan.uniform(len(spec.blocks), 4, schedule="1f1b", microbatches=4)
    stage_bytes = [sum(p.numel() * p.element_size() for block in spec.blocks[start:end]
                       for p in block.parameters()) for start, end in plan.stages]
    job = Job(plan=plan, steps=1, model=model, optimizer=OptimizerFactory("sgd", {"lr": 1e-3}),
              data=model.data(4, seq_len=16), timeout_s=600, record_timeline=False)
    results = launch_local(job)
    return {"launcher": _launcher_peak(), "ranks": [r.peak_memory_bytes for r in results],
            "stage_bytes": stage_bytes}


if __name__ == "__main__":
    print(json.dumps({"tiny": run({}), "big": run(BIG)}))
