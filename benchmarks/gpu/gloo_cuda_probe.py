"""Which collectives gloo runs on CUDA tensors (two processes sharing one GPU): the reason
``--shard`` and ``tp`` are refused where processes share a GPU (docs/gpu.md). Prints one line
per collective, ``ok`` or the error's last line. Run by scripts/gpu_check.sh."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")


def _try(name: str, device: torch.device) -> str:
    one = torch.ones(4, device=device)
    try:
        if name == "all_reduce":
            dist.all_reduce(one)
        elif name == "broadcast":
            dist.broadcast(one, 0)
        elif name == "all_gather_into_tensor":
            dist.all_gather_into_tensor(torch.empty(8, device=device), one)
        else:
            dist.reduce_scatter_tensor(torch.empty(2, device=device), one)
        torch.cuda.synchronize(device)
        return "ok"
    except Exception as error:  # noqa: BLE001 - the probe reports, it does not stop
        return f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:160]}"


def _rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    device = torch.device("cuda", 0)
    for name in COLLECTIVES:
        result = _try(name, device)
        if rank == 0:
            print(f"gloo on CUDA, {name}: {result}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    mp.start_processes(_rank, args=(free,), nprocs=2, start_method="spawn")
