"""A built-in model profiled on this machine as the ranks that will train it here see it.

:func:`profile_model` is :func:`pipeweave.profiler.measure.profile_builtin` with the intra-op
threads one of ``ranks`` local ranks gets (CPU) and, when the ranks outnumber the cores, timed
under that many co-located processes (:mod:`pipeweave.profiler.colocated`). ``pipeweave plan``,
``placement`` and ``simulate`` profile with it; ``auto`` with :func:`profile_sizes` at
:func:`auto_microbatch_sizes` (the default plan's and every other a candidate uses), the
sizes timed interleaved.
:func:`local_shared_cores` is the core count those local ranks share (``--shared-cores
auto``); it and :func:`auto_microbatch_sizes` import no torch (``auto --profile FILE`` plans
without it), so the profiler's modules are imported where a model is profiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..host import machine_cores, threads_per_rank
from ..profiler import Profile

__all__ = ["DEFAULT_MICROBATCH", "auto_microbatch_sizes", "local_shared_cores", "profile_model",
           "profile_sizes"]

DEFAULT_MICROBATCH = 4
"""Samples per micro-batch ``pipeweave auto`` profiles at when neither ``--batch-size`` nor
``--profile`` says otherwise."""


def profile_model(*, model: str, batch_size: int, ranks: int, device: str = "cpu",
                  overrides: Mapping[str, Any] | None = None) -> Profile:
    """``model`` profiled at ``batch_size`` samples per micro-batch for ``ranks`` local
    ranks on ``device`` (module docstring); no link, no runtime costs."""
    return profile_sizes(model=model, batch_sizes=(batch_size,), ranks=ranks, device=device,
                         overrides=overrides)[0]


def profile_sizes(*, model: str, batch_sizes: Sequence[int], ranks: int, device: str = "cpu",
                  overrides: Mapping[str, Any] | None = None) -> tuple[Profile, ...]:
    """:func:`profile_model` at each of ``batch_sizes``, the sizes' timed runs interleaved
    (:func:`pipeweave.profiler.measure.profile_builtin_sizes`: one moment's load slows every
    size alike)."""
    from ..profiler.colocated import needed_colocation  # torch: only where something is timed
    from ..profiler.measure import profile_builtin_sizes

    return profile_builtin_sizes(model, batch_sizes=batch_sizes, device=device,
                                 threads=threads_per_rank(ranks) if device == "cpu" else None,
                                 colocated_ranks=needed_colocation(ranks, device),
                                 overrides=dict(overrides or {}))


def auto_microbatch_sizes(*, batch_size: int | None, ranks: int,
                          microbatches: Sequence[int] | None = None) -> tuple[int, ...]:
    """The micro-batch sizes ``pipeweave auto --model`` profiles at: the default plan's
    first (``batch_size / (2 ranks)``, or :data:`DEFAULT_MICROBATCH`; the profile the others
    scale from), then every other size a one-pipeline candidate uses (the batch over each
    micro-batch count it may have: ``microbatches``, else ``ranks x (1, 2, 4, 8)`` as
    :mod:`pipeweave.auto.axes` tries them; 8, 2 and 1 beside the default 4), largest first,
    so that no such candidate's block times are interpolated or extrapolated
    (:mod:`pipeweave.auto.scaling`); with no other size, a quarter of the default's, so that
    a fixed cost per call and a cost per sample can be told apart."""
    micro = DEFAULT_MICROBATCH if batch_size is None else max(1, batch_size // (2 * ranks))
    batch = micro * 2 * ranks if batch_size is None else batch_size
    counts = microbatches or tuple(ranks * k for k in (1, 2, 4, 8))
    others = {batch // m for m in counts if m >= 1 and batch % m == 0} - {micro}
    if not others:
        others = {max(1, micro // 4)} - {micro}
    return (micro, *sorted(others, reverse=True))


def local_shared_cores(profile: Profile, *, ranks: int) -> int | None:
    """The cores ``ranks`` local ranks share: a CPU profile's machine cores (this machine's
    for a measured profile that does not say) when the ranks outnumber them, else ``None``
    (a core or device per rank)."""
    if profile.device != "cpu":
        return None
    cores = profile.metadata.get("cores", machine_cores() if profile.source == "measured"
                                 else None)
    return int(cores) if isinstance(cores, int) and ranks > cores else None
