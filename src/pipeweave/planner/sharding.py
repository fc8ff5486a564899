"""Which plans may shard their stages over the data-parallel dimension (``Plan.shard``).

``full`` (ZeRO-3) and ``grad-op`` (ZeRO-2) wrap each stage with FSDP2's ``fully_shard`` over
the stage's ``width`` ranks (:mod:`pipeweave.runtime.execution.sharding`); ``none`` keeps
plain replication with its all-reduce. This first slice covers the synchronous schedules
without a split backward; what it refuses names why and the fix (docs/sharding.md). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..schedules import get_info

__all__ = ["SHARD_MODES", "SPLIT_SHARDED", "check_shard"]

SHARD_MODES = ("none", "full", "grad-op")
"""``none``: replicate (all-reduce); ``full``: parameters, gradients and optimizer state
sharded, parameters gathered per use (ZeRO-3); ``grad-op``: the same, but parameters kept
gathered from a forward to its backward (ZeRO-2)."""

SPLIT_SHARDED = ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "v-half", "v-min", "dualpipev")
"""The split-backward (I/W) schedules whose sharded runs the equivalence tests prove exact
(tests/runtime/test_sharding.py); the others stay refused until a test covers them."""


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
    if info.split_backward and schedule not in SPLIT_SHARDED:
        raise ValueError(f"{flag} with {schedule!r}: its split backward (I then W) is not "
                         f"proven exact sharded yet; use {', '.join(SPLIT_SHARDED)}, 1f1b, "
                         f"gpipe or interleaved-1f1b, or --shard none")
