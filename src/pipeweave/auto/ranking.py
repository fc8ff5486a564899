"""The last tie-break of the table: a candidate's identity, so that two searches of the same
profile rank equal predictions in the same order and pick the same winner.

The table sorts by predicted samples/s, then memory, then simplicity (fewer features first,
``search._simplicity``); candidates equal on all three (two methods that give the same split,
two micro-batch counts predicted alike) kept the order they were examined in, which a change
of the examination order (pruning, the time-limited order) moves. Their identity, every
field of the completed candidate as plain comparable values, orders them by what they are.
"""

from __future__ import annotations

import json
from typing import Any

from .problem import Candidate

__all__ = ["identity"]


def identity(candidate: Candidate) -> tuple[Any, ...]:
    """Every field of ``candidate`` as a tuple of plain values that compare (module
    docstring); equal exactly for equal candidates."""
    return (candidate.schedule, candidate.method, candidate.depth, candidate.width,
            candidate.chunks, candidate.pipelines, candidate.microbatches,
            candidate.recompute, candidate.apc, candidate.shard, candidate.tp,
            json.dumps(dict(candidate.options), sort_keys=True, default=str),
            candidate.bounds or (), candidate.replicas or ())
