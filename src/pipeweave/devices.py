"""Where ranks compute and how their messages travel: one rule for every launcher.

    --device cpu                 every rank on the CPU; gloo
    --device cuda, ranks <= GPUs rank r on cuda:r; NCCL (device to device)
    --device cuda, ranks >  GPUs rank r on cuda:(r % GPUs), the ranks share the GPUs; gloo,
                                 messages staged through host memory (NCCL cannot put two
                                 ranks of one group on one device)

"ranks" are the ranks on this machine (torchrun's ``LOCAL_WORLD_SIZE``). The single-process
executor is one rank in this sense: every rank's stages on ``cuda:0``. Asking for CUDA where
torch sees no GPU is a one-line ``ValueError`` naming the fix (:func:`require_device`), raised
before anything is built. torch is imported only when a function runs, so the layers above
the runtime (the profiler) can use this module and still import without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["Placement", "backend_for", "gpu_count", "place", "require_device",
           "sharing_warning"]

DEVICES = ("cpu", "cuda")


def gpu_count() -> int:
    """CUDA devices torch can see (0 without a GPU or a CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_device(device: str, *, flag: str = "--device", gpus: int | None = None) -> None:
    """``ValueError`` in one line unless ``device`` can be used on this machine (``gpus``:
    default, those visible)."""
    if device not in DEVICES:
        raise ValueError(f"{flag} must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and (gpu_count() if gpus is None else gpus) == 0:
        raise ValueError(f"{flag} cuda was asked but torch sees no CUDA device "
                         f"(torch.cuda.is_available() is False); use {flag} cpu, or run on a "
                         f"machine with a GPU and a CUDA build of torch")


def backend_for(device: str, *, local_ranks: int, gpus: int) -> str:
    """The process-group backend: NCCL when every local rank has a GPU of its own, else gloo
    (on the CPU, or ranks sharing GPUs with their messages staged through host memory)."""
    return "nccl" if device == "cuda" and gpus >= local_ranks else "gloo"


def sharing_warning(device: str, *, local_ranks: int, gpus: int) -> str | None:
    """The one line that says ranks will share GPUs (None when they do not)."""
    if device != "cuda" or gpus == 0 or gpus >= local_ranks:
        return None
    return (f"{local_ranks} ranks on {gpus} GPU{'s' if gpus > 1 else ''}: the ranks share "
            f"{'them' if gpus > 1 else 'it'} (rank r on cuda:(r % {gpus})) and send their "
            f"messages through host memory over gloo instead of NCCL; right for trying a "
            f"schedule, slower than one GPU per rank")


@dataclass(frozen=True)
class Placement:
    """One rank's device, backend, and the device its messages travel from."""

    device: torch.device
    backend: str

    @property
    def wire(self) -> torch.device:
        """Where point-to-point buffers live: the rank's device under NCCL, the host under
        gloo (gloo's send and receive read and write host memory only)."""
        import torch

        return self.device if self.backend == "nccl" else torch.device("cpu")

    def group_options(self) -> dict[str, Any]:
        """Extra ``init_process_group`` arguments: NCCL is bound to the rank's GPU
        (``device_id``), so it neither guesses the device from the rank nor warns about it."""
        return {"device_id": self.device} if self.backend == "nccl" else {}

    def barrier_options(self) -> dict[str, Any]:
        """Extra ``barrier`` arguments: the rank's GPU under NCCL."""
        return {"device_ids": [self.device.index]} if self.backend == "nccl" else {}


def place(device: str, *, local_rank: int, local_ranks: int,
          gpus: int | None = None) -> Placement:
    """Rank ``local_rank`` of ``local_ranks`` on this machine (``gpus``: default, those
    visible); see the module docstring."""
    import torch

    count = gpu_count() if gpus is None and device == "cuda" else gpus or 0
    require_device(device, gpus=count)
    if device == "cpu":
        return Placement(torch.device("cpu"), "gloo")
    return Placement(torch.device("cuda", local_rank % count),
                     backend_for(device, local_ranks=local_ranks, gpus=count))
