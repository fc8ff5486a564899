"""Which plans may shard their stages over the data-parallel dimension (``Plan.shard``).

``full`` (ZeRO-3) and ``grad-op`` (ZeRO-2) wrap each stage with FSDP2's ``fully_shard`` over
the stage's ``width`` ranks (:mod:`pipeweave.runtime.execution.sharding`); ``none`` keeps
plain replication with its all-reduce. This slice covers every synchronous schedule, split
backward (I/W) included; what it refuses names why and the fix (docs/sharding.md). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..schedules import get_info

__all__ = ["SHARD_MODES", "check_shard"]

SHARD_MODES = ("none", "full", "grad-op")
"""``none``: replicate (all-reduce); ``full``: parameters, gradients and optimizer state
sharded, parameters gathered per use (ZeRO-3); ``grad-op``: the same, but parameters kept
gathered from a forward to its backward (ZeRO-2)."""


def check_shard(shard: str, *, schedule: str, width: int, replicas: Sequence[int] | None,
                pipelines: int) -> None:
    """Refuse, in one line naming why and the fix, a sharding this slice cannot keep exact."""
    if shard not in SHARD_MODES:
        raise ValueError(f"shard {shard!r} is not one of {', '.join(SHARD_MODES)}; give "
                         f"--shard full (ZeRO-3), grad-op (ZeRO-2) or none")
    if shard == "none":
        return
    info = get_info(schedule)
    flag = f"--shard {shard}"
    if replicas is not None:
        raise ValueError(f"{flag} with replicated stages {list(replicas)}: only the uniform "
                         f"width is sharded yet; give --width instead of replicas, or --shard none")
    if pipelines > 1:
        raise ValueError(f"{flag} with {pipelines} parallel pipelines (AvgPipe): the elastic "
                         f"averaging reads whole parameters; use one pipeline or --shard none")
    if width < 2:
        raise ValueError(f"{flag} shards each stage over its data-parallel copies but width "
                         f"is {width}; give --width 2 or more (--mesh pp=P,dp=D), or --shard none")
    if not info.synchronous:
        raise ValueError(f"{flag} with the asynchronous schedule {schedule!r}: its stashed or "
                         f"predicted weight versions are not sharded yet; use a synchronous "
                         f"schedule (1f1b, gpipe, interleaved-1f1b) or --shard none")
