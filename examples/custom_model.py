"""Train your own model with pipeweave: a 4-block MLP on 2 local ranks with 1F1B.

Run:  .venv/bin/python examples/custom_model.py

Every rank calls the three factories itself, so they must be picklable (top-level functions
here) and deterministic (same weights, same batches on every rank).
"""

import torch

from pipeweave.models import ModelSpec
from pipeweave.runtime import Job, Plan, iteration_losses, launch_local, merged_parameters, run_local

STEPS, MICROBATCHES, BATCH = 20, 4, 32


def my_model() -> ModelSpec:
    torch.manual_seed(0)
    hidden = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(3)]
    return ModelSpec.from_blocks(hidden + [torch.nn.Linear(64, 10)], torch.nn.functional.cross_entropy)


def my_data():
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(64, 10, generator=g)
    while True:
        x = torch.randn(BATCH, 64, generator=g)       # [B, 64]
        yield x, (x @ teacher).argmax(dim=1)          # [B] class ids


def my_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2)


if __name__ == "__main__":  # required: ranks are started as fresh processes that import this file
    plan = Plan.uniform(4, 2, schedule="1f1b", microbatches=MICROBATCHES)  # blocks [0,2) and [2,4)
    job = Job(plan=plan, steps=STEPS, model=my_model, data=my_data, optimizer=my_optimizer,
              return_parameters=True)
    distributed = launch_local(job)   # 2 processes over gloo
    local = run_local(job)            # the same action lists in one process
    losses = iteration_losses(distributed, MICROBATCHES)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {STEPS} steps")
    same = all(torch.equal(a, merged_parameters(local)[n]) for n, a in merged_parameters(distributed).items())
    print("distributed and single-process runs agree exactly:", same)
