"""What makes two plans twins: the same plan less its recomputation (``search.twin_bound``).

A plan recomputing a superset of another's stages, the same plan otherwise, runs the same
actions with longer backwards, so it is at least as slow (docs/auto.md, "Twins"). "The
same plan" is its JSON without ``recompute``, and with APC. The Slicer (AutoPipe's
Algorithm 2, ``sliced-1f1b``) is filled with the stage costs (``costs``), which
recomputation changes, yet its schedule depends on them only through the number of
micro-batches it slices (:func:`~pipeweave.schedules.sliced.slicer_count`, at most M):
two plans whose costs slice the same count run the same actions, so the key holds that
count instead of the costs. At planning scale the recompute prefixes of a 256-stage sliced
1F1B were each simulated (some 7 s each) although they all slice as many as the one
recomputing nothing (``tests/auto/test_twin_key.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..schedules import get_info
from ..schedules.sliced import slicer_count

__all__ = ["twin_key"]


def twin_key(data: Mapping[str, Any], apc: bool) -> str:
    """``data`` (a plan's JSON) less its recomputation, the Slicer's costs as its count."""
    kept = {k: v for k, v in data.items() if k != "recompute"}
    options = kept.get("schedule_options")
    name = kept.get("schedule")
    if isinstance(name, str) and get_info(name).sliced == name \
            and isinstance(options, Mapping) and "costs" in options:
        forward, backward, comm = options["costs"]
        kept["schedule_options"] = {**{k: v for k, v in options.items() if k != "costs"},
                                    "sliced by costs": slicer_count(forward, backward, comm)}
    return json.dumps([kept, apc], sort_keys=True)
