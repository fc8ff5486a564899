"""Complete a freshly measured profile with what this machine's runs add to the blocks' times:
the link between two local ranks (:func:`pipeweave.profiler.link.measure_link`) and the
runtime's fixed costs per action (:mod:`pipeweave.profiler.runtime_costs`, measured by
:func:`~pipeweave.measure.runtime_costs.measure_runtime_costs`), so that the simulator
predicts what ``pipeweave train`` will measure here, not only the blocks' compute.

and the bandwidth of the runtime's all-reduce between two local processes
(:mod:`pipeweave.measure.collective`, ``RuntimeCosts.allreduce_bandwidth``).

What a distributed run adds beyond these, the latency a message between rank processes
really has and the all-reduce's fixed cost, is fitted from real runs of the default and a
data-parallel plan: :mod:`pipeweave.measure.calibration_runs`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..profiler import Profile

__all__ = ["calibrate", "calibration_skipped"]


def calibration_skipped(*, device: str, precision: str) -> str | None:
    """Why the runtime costs cannot be measured for this profile, or ``None``."""
    if device != "cpu":
        return (f"runtime costs are measured on CPU only (the single-process executor); "
                f"the {device} profile keeps its blocks' times")
    if precision != "full":
        return (f"runtime costs are measured in full precision only; the --precision "
                f"{precision} profile keeps its blocks' times")
    return None


def calibrate(profile: Profile, *, model: str, overrides: Mapping[str, Any] | None = None,
              device: str = "cpu", precision: str = "full", seq_len: int | None = None,
              link: bool = True, runtime: bool = True, allreduce: bool = True,
              say: Callable[[str], None] | None = None) -> Profile:
    """``profile`` (of ``model``) with the measured link (``link``, when it has none),
    runtime costs (``runtime``, when it has none and :func:`calibration_skipped` allows) and
    the all-reduce's bandwidth (``allreduce``, with the runtime costs, when they have none)."""
    if link and profile.link is None:
        from ..profiler.link import measure_link

        if device == "cpu":
            profile = profile.with_link(measure_link(device=device))
    skipped = calibration_skipped(device=device, precision=precision)
    if runtime and profile.runtime is None and skipped is None:
        from .runtime_costs import measure_runtime_costs

        costs = measure_runtime_costs(profile, model=model, overrides=dict(overrides or {}),
                                      seq_len=seq_len, say=say)
        profile = replace(profile, runtime=costs)
    if allreduce and profile.runtime is not None and profile.runtime.allreduce_bandwidth is None \
            and skipped is None:
        from .collective import measure_allreduce

        timed = measure_allreduce()
        if say is not None:
            say(f"all-reduce: {timed.bandwidth / 1e9:.2f} GB/s, {1e3 * timed.latency:.2f} ms "
                "a call")
        profile = replace(profile, runtime=replace(profile.runtime,
                                                   allreduce_bandwidth=timed.bandwidth))
    return profile
