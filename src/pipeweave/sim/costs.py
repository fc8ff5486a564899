"""Costs: what every action of a schedule takes, per (virtual) stage and per stage boundary.

The simulator times a schedule with these numbers::

    F of stage s             forward[s]          (a Slicer half, piece a/b: half_forward[s],
                                                  by default forward[s] / 2)
    B of stage s             backward[s]         (the whole backward; of a micro-batch whose
                                                  forward ran in halves: 2 half_backward[s],
                                                  one backward per half as the runtime runs
                                                  it, by default backward[s]; its I and W
                                                  likewise)
    I of stage s             input_grad[s], by default backward[s] - weight_grad[s]
                                                 (input gradient, split backward)
    W of stage s             weight_grad[s]                  (weight gradient, split backward)
    activation s -> s+1      latency + transfer[s]   (half piece: latency + transfer[s] / 2)
    gradient   s+1 -> s      latency + transfer[s]   (the gradient has the activation's shape)
    U / AR / AV of stage s   update[s] / all_reduce[s] / average[s]

``transfer[s]`` is either given directly (``comm``) or derived from the bytes crossing the
boundary and the link bandwidth (``boundary_bytes / bandwidth``). AutoPipe (§III-B) uses a
single ``Comm`` for every boundary and both directions; a scalar ``comm`` is exactly that.

Every per-stage field takes one number (the same for every stage) or one value per stage;
with chunks (interleaved, WPipe) a "stage" is a virtual stage, i.e. a chunk: stage ``s`` of a
``P``-rank, ``V``-chunk layout runs on rank ``s % P``. Per-boundary fields take one number or
``stages - 1`` values. :meth:`Costs.resolve` expands and checks them against a schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["Costs", "StageCosts", "check_number", "check_shared_cores"]

PerStage = float | Sequence[float]
"""One number for every stage, or one number per stage."""

_PER_STAGE = ("forward", "backward", "activation_bytes", "update", "all_reduce", "average")
_OPTIONAL_PER_STAGE = ("weight_grad", "input_grad", "half_forward", "half_backward",
                       "half_weight_grad")
_PER_BOUNDARY = ("comm", "boundary_bytes")


@dataclass(frozen=True)
class Costs:
    """Validated per-action costs (times in any unit, seconds for real profiles).

    Attributes:
        forward: forward time of a whole micro-batch, per stage (default 1).
        backward: backward time of a micro-batch, per stage (default 2): the whole backward,
            what a ``B`` costs; a split backward's ``I`` and ``W`` together cost the same.
        weight_grad: the weight-gradient part of ``backward``, per stage: what a ``W`` costs;
            an ``I`` costs ``backward - weight_grad`` (zero-bubble schedules, Qi et al., ICLR
            2024, §2). ``None`` (default): half the backward, so the defaults F=1, B=2 give
            F = I = W = 1, the paper's idealised units. Must not exceed ``backward``.
        input_grad: what an ``I`` costs, per stage. ``None`` (default): ``backward -
            weight_grad``, a split that costs nothing extra. A measured profile gives it
            (``BlockProfile.input_grad``): on a real device the two halves of a split backward
            together usually take longer than one whole backward (two autograd passes, one call
            per parameter-holding module in ``W``), and the simulator then sees that price.
        comm: transfer time of one activation (or gradient) across each boundary ``s -> s+1``;
            one number or ``stages - 1`` values (default 0). Leave it at 0 when you give
            ``boundary_bytes`` and ``bandwidth`` instead.
        boundary_bytes: bytes sent across each boundary; with ``bandwidth`` it defines the
            transfer time ``boundary_bytes / bandwidth``.
        bandwidth: link bandwidth in bytes per time unit (needed with ``boundary_bytes``).
        latency: fixed cost of every transfer, paid in full even for a half piece (default 0).
        activation_bytes: bytes a stage keeps from a forward until its backward (the stashed
            activation), per stage; the default 1 counts activations in micro-batch units.
        update: optimizer-step time per stage (default 0).
        all_reduce: gradient all-reduce time among a stage's replicas (default 0).
        average: elastic-averaging exchange time per stage (AvgPipe, default 0).
        half_forward: what a Slicer half's ``F`` (piece ``a``/``b``: half the micro-batch's
            samples) costs, per stage. ``None`` (default): half the forward. On a real device
            a half costs more than half (every call pays a fixed cost): a planner gives the
            block times at half the micro-batch size (:mod:`pipeweave.auto.half_costs`).
        half_backward: one half's share of the backward of a micro-batch whose forward ran
            in halves, per stage: that ``B`` runs one backward per half (the runtime's
            ``StageRuntime.backward``) and costs twice this (a planner keeps the action's
            fixed costs in it once, :mod:`pipeweave.auto.half_costs`). ``None`` (default): half the
            backward, so that ``B`` costs ``backward``.
        half_weight_grad: the weight-gradient part of ``half_backward`` (a split backward of
            a sliced micro-batch: its ``W`` costs twice this, its ``I`` twice ``half_backward
            * input_grad / backward``). ``None`` (default): ``half_backward`` in the whole's
            proportion ``weight_grad / backward``. Needs ``half_backward``, must not exceed it.
        shared_cores: the ranks share this many CPU cores (ranks launched as processes on one
            CPU machine); forwards, backwards and updates in progress at once then split the
            cores (:mod:`pipeweave.sim.shared_cores`). ``None`` (default): every rank has its
            own device.
        wait_share: with ``shared_cores``, the share of a core a rank takes while it waits
            (for a message, an all-reduce; gloo's and the send thread's work on a CPU
            machine): ``n`` ranks computing beside ``m`` waiting run at ``min(1, cores /
            (n + wait_share * m))`` (:mod:`pipeweave.sim.shared_cores`). Default 0; read only
            where the ranks outnumber the cores.
    """

    forward: PerStage = 1.0
    backward: PerStage = 2.0
    weight_grad: PerStage | None = None
    input_grad: PerStage | None = None
    comm: PerStage = 0.0
    boundary_bytes: PerStage | None = None
    bandwidth: float | None = None
    latency: float = 0.0
    activation_bytes: PerStage = 1.0
    update: PerStage = 0.0
    all_reduce: PerStage = 0.0
    average: PerStage = 0.0
    shared_cores: int | None = None
    half_forward: PerStage | None = None
    half_backward: PerStage | None = None
    half_weight_grad: PerStage | None = None
    wait_share: float = 0.0

    def __post_init__(self) -> None:
        check_shared_cores(self.shared_cores)
        for name in _PER_STAGE + _OPTIONAL_PER_STAGE + _PER_BOUNDARY:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _normalise(name, value))
        for name in ("latency", "wait_share"):
            object.__setattr__(self, name, check_number(name, getattr(self, name)))
        if self.bandwidth is not None:
            check_number("bandwidth", self.bandwidth)
            if self.bandwidth <= 0:
                raise ValueError(f"bandwidth must be > 0 bytes per time unit, got {self.bandwidth}")
        if (self.boundary_bytes is None) != (self.bandwidth is None):
            raise ValueError(
                f"boundary_bytes={self.boundary_bytes!r} and bandwidth={self.bandwidth!r}: give "
                "both (transfer time = bytes / bandwidth) or neither"
            )
        if self.weight_grad is not None:
            backward, weight_grad = _as_tuple(self.backward), _as_tuple(self.weight_grad)
            if len(backward) == len(weight_grad) or 1 in (len(backward), len(weight_grad)):
                _check_weight_grad(backward, weight_grad)
        _check_halves(self.half_backward, self.half_weight_grad)
        if self.boundary_bytes is not None and any(_as_tuple(self.comm)):
            raise ValueError(
                f"comm={self.comm!r} and boundary_bytes/bandwidth both define the transfer time; "
                "give only one of them"
            )

    @classmethod
    def uniform(
        cls, forward: float = 1.0, backward: float = 2.0, comm: float = 0.0,
        **others: Any
    ) -> "Costs":
        """The same forward, backward and communication time on every stage and boundary.

        With the defaults (F=1, B=2, C=0) GPipe and 1F1B take ``(M+P-1)(F+B)`` per iteration.
        """
        return cls(forward=forward, backward=backward, comm=comm, **others)

    def resolve(self, stages: int) -> "StageCosts":
        """Expand every field to one value per stage / boundary of a ``stages``-stage schedule."""
        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        per_stage = {
            name: _expand(name, getattr(self, name), stages, "stage") for name in _PER_STAGE
        }
        if self.weight_grad is None:
            weight_grad = tuple(b / 2 for b in per_stage["backward"])
        else:
            weight_grad = _expand("weight_grad", self.weight_grad, stages, "stage")
            _check_weight_grad(per_stage["backward"], weight_grad)
        input_grad = (() if self.input_grad is None
                      else _expand("input_grad", self.input_grad, stages, "stage"))
        if self.boundary_bytes is not None:
            assert self.bandwidth is not None
            sizes = _expand("boundary_bytes", self.boundary_bytes, stages - 1, "boundary")
            transfer = tuple(b / self.bandwidth for b in sizes)
        else:
            transfer = _expand("comm", self.comm, stages - 1, "boundary")
        half_forward, half_backward, half_weight_grad = (
            () if getattr(self, name) is None
            else _expand(name, getattr(self, name), stages, "stage")
            for name in ("half_forward", "half_backward", "half_weight_grad"))
        if half_weight_grad:
            _check_halves(half_backward, half_weight_grad)
        return StageCosts(transfer=transfer, latency=self.latency, shared_cores=self.shared_cores,
                          wait_share=self.wait_share,
                          weight_grad=weight_grad, input_grad=input_grad,
                          half_forward=half_forward, half_backward=half_backward,
                          half_weight_grad=half_weight_grad, **per_stage)

    def to_json(self) -> dict[str, object]:
        """Plain JSON-able form (sequences as lists); ``weight_grad`` as the value simulated
        (half the backward when it was not given), so ``Costs(**to_json())`` is the same."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "weight_grad" and value is None:
                value = _halves(self.backward)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class StageCosts:
    """Costs expanded for one schedule: tuples indexed by stage (and by boundary for transfers)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    transfer: tuple[float, ...]
    latency: float
    activation_bytes: tuple[float, ...]
    update: tuple[float, ...]
    all_reduce: tuple[float, ...]
    average: tuple[float, ...]
    shared_cores: int | None = None
    wait_share: float = 0.0
    """The share of a core a waiting rank takes where ranks share cores (``Costs``)."""
    weight_grad: tuple[float, ...] = ()
    """What a ``W`` costs per stage (empty: half the backward)."""
    input_grad: tuple[float, ...] = ()
    """What an ``I`` costs per stage (empty: the backward less its weight-gradient part)."""
    half_forward: tuple[float, ...] = ()
    """What a Slicer half's ``F`` costs per stage. The four half costs are all empty (none
    given: a half costs half the whole, a sliced micro-batch's backward the whole's) or all
    filled (``explicit_halves``)."""
    half_backward: tuple[float, ...] = ()
    """One half's backward per stage."""
    half_weight_grad: tuple[float, ...] = ()
    """One half's ``W`` per stage (default: ``half_backward`` in the whole's proportion)."""
    half_input_grad: tuple[float, ...] = ()
    """One half's ``I`` per stage (default: ``half_backward`` in the whole's proportion)."""

    def __post_init__(self) -> None:
        if not self.weight_grad:
            object.__setattr__(self, "weight_grad", tuple(b / 2 for b in self.backward))
        if not self.input_grad:
            object.__setattr__(self, "input_grad",
                               tuple(b - w for b, w in zip(self.backward, self.weight_grad)))
        _fill_halves(self)

    @property
    def explicit_halves(self) -> bool:
        """Whether half costs were given (the four half fields are filled)."""
        return bool(self.half_forward)

    def comm(self, boundary: int, half: bool = False) -> float:
        """Time of one transfer across ``boundary`` (between stages ``boundary`` and ``+1``)."""
        transfer = self.transfer[boundary]
        return self.latency + (transfer / 2 if half else transfer)


def _fill_halves(table: StageCosts) -> None:
    """Where a half cost was given, fill the other half costs with their defaults (the field
    docstrings); with none given they stay empty and every interpreter prices a half as
    half the whole (the same numbers as before half costs existed)."""
    if not (table.half_forward or table.half_backward):
        return
    half_backward = table.half_backward or tuple(b * 0.5 for b in table.backward)
    values = {
        "half_forward": table.half_forward or tuple(f * 0.5 for f in table.forward),
        "half_backward": half_backward,
        "half_weight_grad": table.half_weight_grad or _share(half_backward, table.weight_grad,
                                                             table.backward),
        "half_input_grad": table.half_input_grad or _share(half_backward, table.input_grad,
                                                           table.backward)}
    for name, value in values.items():
        object.__setattr__(table, name, value)


def _share(half: tuple[float, ...], part: tuple[float, ...],
           whole: tuple[float, ...]) -> tuple[float, ...]:
    """``half`` in the proportion ``part / whole``, per stage (half of it where whole is 0)."""
    return tuple(h * p / w if w > 0 else h * 0.5 for h, p, w in zip(half, part, whole))


def _check_halves(half_backward: PerStage | None, half_weight_grad: PerStage | None) -> None:
    """Refuse a half's weight gradient without a half backward, or larger than it."""
    if half_weight_grad is None:
        return
    if half_backward is None:
        raise ValueError(f"half_weight_grad={half_weight_grad!r} needs half_backward (the W is "
                         f"part of a half's backward); give half_backward too, or neither")
    backward, weight = _as_tuple(half_backward), _as_tuple(half_weight_grad)
    if len(backward) != len(weight) and 1 not in (len(backward), len(weight)):
        return  # resolve() expands both and checks again
    count = max(len(backward), len(weight))
    for s in range(count):
        b, w = backward[s % len(backward)], weight[s % len(weight)]
        if w > b:
            raise ValueError(f"half_weight_grad {w:g} exceeds half_backward {b:g} on stage {s}: "
                             f"a half's W is part of its backward; give half_weight_grad <= "
                             f"half_backward")


def check_shared_cores(value: object) -> None:
    """Refuse a ``shared_cores`` that is neither ``None`` nor an integer >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"shared_cores must be an integer >= 1 or None, got {value!r}: the CPU "
                         f"cores the ranks share, or None for a device per rank")


def _check_weight_grad(backward: tuple[float, ...], weight_grad: tuple[float, ...]) -> None:
    """Refuse a weight-gradient part larger than the backward it is part of."""
    count = max(len(backward), len(weight_grad))
    for s in range(count):
        b, w = backward[s % len(backward)], weight_grad[s % len(weight_grad)]
        if w > b:
            where = f"stage {s}" if count > 1 else "every stage"
            raise ValueError(
                f"weight_grad {w:g} exceeds backward {b:g} on {where}: the weight gradient (W) is "
                f"part of the whole backward (B = I + W); give weight_grad <= backward"
            )


def _halves(value: PerStage) -> float | tuple[float, ...]:
    return tuple(v / 2 for v in value) if isinstance(value, Sequence) else value / 2


def _as_tuple(value: PerStage) -> tuple[float, ...]:
    return tuple(value) if isinstance(value, Sequence) else (value,)


def check_number(name: str, value: object, *, meaning: str = "") -> float:
    """``value`` as a float when it is a finite number >= 0 (not a bool); else a ValueError
    naming ``name`` (the argument the caller was given) and, when given, its ``meaning``.
    Every cost of :class:`Costs` and ``walk_shared_cores``' ``waiting`` are checked here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        about = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must be a finite number >= 0{about}, got {value!r}")
    return float(value)


def _normalise(name: str, value: object) -> float | tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, float, Sequence)):
        raise ValueError(f"{name} must be a number or a sequence of numbers, got {value!r}")
    if isinstance(value, Sequence):
        if len(value) == 0:
            raise ValueError(f"{name} is an empty sequence; give one number or one per stage")
        if all(type(v) is float and 0.0 <= v < math.inf for v in value):
            return tuple(value)  # what check_number gives each, without naming each
        return tuple(check_number(f"{name}[{i}]", v) for i, v in enumerate(value))
    return check_number(name, value)


def _expand(name: str, value: object, count: int, unit: str) -> tuple[float, ...]:
    if isinstance(value, tuple):
        if len(value) != count:
            what = "one per stage (virtual stage, with chunks)" if unit == "stage" else \
                "one per stage boundary (stages - 1)"
            raise ValueError(
                f"{name} has {len(value)} values {list(value)} but the schedule has {count} "
                f"{unit}{'s' if count != 1 else ''}; give a single number or {what}"
            )
        return value
    assert isinstance(value, float)
    return (value,) * count
