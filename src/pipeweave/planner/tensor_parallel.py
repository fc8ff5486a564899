"""Which plans may split each stage over tensor-parallel ranks (``Plan.tp``).

With ``tp = T`` every rank of the ``pp x dp`` pipeline grid becomes ``T`` processes that hold
the stage's layers split by heads and hidden units (Megatron's column/row split, run by
:mod:`pipeweave.runtime.execution.tensor_parallel`). The schedule does not see ``tp``: each of
the ``T`` processes interprets its pipeline rank's program. This slice covers the synchronous
schedules on a uniform mesh; what it refuses names why and the fix (docs/sharding.md). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..schedules import get_info

__all__ = ["check_tp"]


def check_tp(tp: int, *, schedule: str, width: int, replicas: Sequence[int] | None,
             pipelines: int) -> None:
    """Refuse, in one line naming why and the fix, a tensor-parallel plan this slice cannot
    keep exact."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"plan tp={tp!r}: give the tensor-parallel size as an int >= 1")
    if tp == 1:
        return
    info = get_info(schedule)
    flag = f"tp={tp}"
    refusals = [
        (replicas is not None, f"with replicated stages {list(replicas or ())}: only a uniform "
         f"pp x dp x tp mesh is built; give --width instead of replicas, or tp=1"),
        (pipelines > 1, f"with {pipelines} parallel pipelines (AvgPipe): the elastic averaging "
         f"reads whole parameters; use one pipeline or tp=1"),
        (not info.synchronous, f"with the asynchronous schedule {schedule!r}: stashed and "
         f"predicted weight versions of split layers are not built; use 1f1b, gpipe, "
         f"interleaved-1f1b or zb-h1, or tp=1"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"{flag} {why}")
