"""A parameter's global name: ``"<block>.<name>"``, the same whichever stage holds the block.

A stage is ``nn.Sequential(blocks[start:end])``, so its parameters are named ``"<i>.<name>"``
with ``i`` counted from the stage's first block. Adding ``start`` gives the name the parameter
has in the whole block list: what results, checkpoints and the oracle key parameters by, so
that any split of the model (another stage count, chunks, replicas) finds each one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["global_name", "global_names"]

T = TypeVar("T")


def global_name(local: str, first_block: int) -> str:
    """Stage-local ``"<i>.<rest>"`` to global ``"<first_block + i>.<rest>"``."""
    index, _, rest = local.partition(".")
    if not index.isdigit() or not rest:
        raise ValueError(f"parameter name {local!r} is not '<block index>.<name>'; stages are "
                         f"nn.Sequential lists of blocks, whose parameters are named that way")
    return f"{first_block + int(index)}.{rest}"


def global_names(named: Iterable[tuple[str, T]], first_block: int) -> Iterator[tuple[str, T]]:
    """``(global name, value)`` for each stage-local ``(name, value)`` (e.g. ``named_parameters()``)."""
    for local, value in named:
        yield global_name(local, first_block), value
