"""1F1B with flush (PipeDream-flush / DAPPLE): warm-up, one-forward-one-backward, cool-down.

P=3, M=4; stage s keeps at most min(P-s, M) activations (GPipe keeps M)::

    rank0  F0 F1 F2 .  B0 F3 B1 .  B2 .  B3
    rank1  .  F0 F1 B0 F2 B1 F3 B2 .  B3
    rank2  .  .  F0 B0 F1 B1 F2 B2 F3 B3
"""

from __future__ import annotations

from ..ir import Schedule
from .common import flush_schedule, one_f_one_b_order
from .registry import Shape, register

__all__ = ["one_f_one_b"]


@register("1f1b", description="PipeDream-flush / DAPPLE: warm-up, 1F1B steady state, cool-down, flush",
          paper="D. Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training (PipeDream-flush), ICML 2021; S. Fan et al., DAPPLE, PPoPP 2021", synchronous=True,
          width=True, replicas=True, chunks=None, sliced="sliced-1f1b", torch_schedule="1F1B")
def one_f_one_b(shape: Shape) -> Schedule:
    return flush_schedule("1f1b", shape, one_f_one_b_order)
