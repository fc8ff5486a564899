"""The files written beside a plan: Megatron-Core's layout string and torchtitan's config
(:mod:`pipeweave.planner.interchange`), where the plan can be said in their words."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..planner import Plan
from ..planner.interchange import NotExpressible, megatron_layout, torchtitan_config

__all__ = ["write_plan_exports"]


def write_plan_exports(plan: Plan, names: Sequence[str], *, batch_size: int,
                       plan_file: Path) -> dict[str, str]:
    """Write ``<plan>.megatron.txt`` and ``<plan>.torchtitan.toml`` beside ``plan_file``;
    returns, per system, the file written or why there is none (a stale file of an earlier
    plan is removed, so what lies beside the plan always describes it)."""
    made: dict[str, str] = {}
    outputs = {
        "megatron": (plan_file.with_suffix(".megatron.txt"),
                     lambda: megatron_layout(plan, names) + "\n"),
        "torchtitan": (plan_file.with_suffix(".torchtitan.toml"),
                       lambda: torchtitan_config(plan, names, batch_size=batch_size)),
    }
    for system, (path, render) in outputs.items():
        try:
            text = render()
        except NotExpressible as reason:
            path.unlink(missing_ok=True)
            made[system] = f"none: {reason}"
            continue
        path.write_text(text)
        made[system] = str(path)
    return made
