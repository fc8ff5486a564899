"""What the runtime adds to a stage's profiled compute: fixed costs per action and per block.

The profiler times each block alone, one ``forward``/``backward``/optimizer step at a time.
A pipeline stage runs several blocks in one action, inside the runtime (its interpreter, the
stage's hooks, the detach at the boundary, the loss, the activation meter, the timeline),
so a stage's action does not cost the plain sum of its blocks: it pays the runtime's fixed
cost once per action, and it does *not* pay the profiler's per-call cost (one autograd call,
one optimizer step) once per block. Per kind of action (``forward``, ``backward``,
``input_grad``, ``weight_grad``, ``update``)::

    action(stage of k blocks) = sum of the blocks' profiled times + per_action + per_block * (k - 1)

``per_action`` is what one action of a one-block stage costs beyond its block's profiled
time; ``per_block`` what each further block adds beyond its profiled time (negative where the
profiler's per-call cost, paid once per block when blocks are timed alone, is paid once per
stage: an optimizer step over a stage's parameters is one call). ``per_message`` is the CPU
time a rank spends posting one send (the transfer itself is the link's). ``message_latency``
is what a message between two rank *processes* takes beyond the link's ping-pong latency (the
receiving rank waking up, the send thread getting the interpreter, gloo's own threads on
shared cores), added to every transfer's latency: fitted, with the all-reduce's fixed cost
and a compute scale, so that the simulated default plan and a data-parallel plan time as
their alternating real runs measured (``pipeweave auto --model``,
:mod:`pipeweave.measure.calibration_runs`).
On a device with milliseconds per block these are noise; on a CPU model whose blocks take a
few hundred microseconds they are a large part of the iteration, which is why a simulation
without them under-predicts small models (docs/auto.md).

They are measured by running the real runtime (:mod:`pipeweave.measure.runtime_costs`, its
single-process executor: the same stage code, no transport) on splits with one block per
stage and with several, and fitting the line above per kind. The planner applies them in
:func:`pipeweave.planner.evaluate.plan_costs`; a profile without them (imported, synthetic,
or written before) is taken as it is.

The all-reduce of a replicated stage's gradients is what the runtime does for it (an
all-gather of every replica's flat gradient over gloo, then a local sum,
``runtime/communication/transport.py``), priced where it was measured as::

    all_reduce(|w|, r) = allreduce_latency + (r - 1) |w| / allreduce_bandwidth

(each rank receives the other ``r - 1`` copies), never below the ring formula at the
stage's link (``4 (r - 1) |w| / (r B)``, pipedream.txt §3.1, for a slower link between
machines). ``allreduce_bandwidth`` comes from timing that all-gather at several sizes between
two local processes, ``allreduce_latency`` from a real run of a data-parallel plan
(:mod:`pipeweave.measure.calibration_runs`): on gloo over loopback the all-gather moves some
0.3 GB/s against the 3.6 GB/s a ping-pong of the same bytes shows, so the ring formula at
the link under-counted it tenfold. Without them (``allreduce_bandwidth`` ``None``) the ring
formula at the link stands, each of its ``2 (r - 1)`` steps paying ``message_latency``.

``compute_scale`` (>= 1) multiplies every compute action (forward, backward, I, W, with
the posting of their sends, as the simulator times them; not the update): what the ranks' compute took on the timelines of the
calibration's distributed runs over what the simulator gave it (the send thread and gloo's
threads on the same cores, two ranks' memory traffic at once). Never below 1, so that the
search's lower bounds from the profile's times stay bounds: a calibration whose runs computed
faster than the profile puts that factor into the blocks' times instead
(:func:`pipeweave.measure.calibration_runs.with_costs`). ``size_scales`` refine it by the
stage's micro-batch size: ``(samples, factor >= 1)`` pairs, the scale at a size
``compute_scale`` times the factor, linear in the logarithm of the size between two pairs,
the nearest pair's outside (:meth:`RuntimeCosts.size_factor`), fitted from the calibration's
data-parallel plans at two sizes (:mod:`pipeweave.measure.calibration_sizes`: the profile
prices small micro-batches high against what the runtime's actions take).

``compute_per_action`` is added to every F, B, I and W action after the fixed costs above
(and their floor), before the scale: what each compute action of a distributed run takes
inside the timed action beyond the blocks and ``per_action`` measured in one process. The
calibration fitted it until 2026-11-27 and fits ``size_scales`` instead
(:mod:`pipeweave.measure.calibration_sizes` says why); a saved profile may carry it.

``compute_per_receive`` is added, like ``compute_per_action`` and inside the scale, to every
action that takes a message from another rank: the F of a stage whose previous stage is on
other ranks, the B and I of one whose next stage is: what a pipeline's rank pays inside the
timed action when it starts on a message it waited for (woken, its caches cold; the
calibration's default plan computed at about twice the data-parallel plan's scale on cnn at
4 ranks on 2 cores, some 1.2-1.5 on gpt-tiny, whose actions are larger; 1.01-1.28 against
0.92-1.16 at 2 ranks on 2 cores). Fitted from the default plan's compute at the
data-parallel plan's scale (:mod:`pipeweave.measure.calibration_rounds`).

``action_overhead`` is added, once, to every F, B, I and W action and once more for each
send the action posts, after the scale: what each action and message costs a rank beyond its
compute when more ranks than cores share the machine (the interpreter between actions, the
wake-up when the core comes back, outside the timed action itself). Fitted so that a
data-parallel plan at the smallest micro-batches the search uses times as its real runs do
(:mod:`pipeweave.measure.calibration_runs`, ranks > cores only; 0 otherwise).

``wait_share`` is the share of a core that a rank takes while it waits (for a message, for
the other replicas of an all-reduce) where more ranks than cores share the machine: gloo's
socket thread and the send thread move every message, and a woken rank queues for a core.
The simulator's shared-cores walk runs ``n`` computing ranks beside ``m`` waiting ones at
``min(1, cores / (n + wait_share * m))`` (:mod:`pipeweave.sim.shared_cores`). The
alternative to ``compute_per_receive``: fitted the same way in its place where
``pipeweave.measure.calibration_runs.WAITING`` names it (ranks > cores only); 0 otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RuntimeCosts", "ACTION_KINDS"]

ACTION_KINDS = ("forward", "backward", "input_grad", "weight_grad", "update")
"""The kinds of compute action a stage runs, named as the profile's per-block columns."""


@dataclass(frozen=True)
class RuntimeCosts:
    """Fixed runtime costs per action kind (module docstring); seconds."""

    per_action: Mapping[str, float] = field(default_factory=dict)
    per_block: Mapping[str, float] = field(default_factory=dict)
    per_message: float = 0.0
    message_latency: float = 0.0
    allreduce_latency: float = 0.0
    allreduce_bandwidth: float | None = None
    action_overhead: float = 0.0
    """Seconds each F, B, I and W action, and each send it posts, costs beyond its compute
    (module docstring)."""
    compute_per_action: float = 0.0
    """Seconds each F, B, I and W action computes beyond its blocks and ``per_action`` in a
    distributed run, inside the timed action (module docstring)."""
    compute_per_receive: float = 0.0
    """Seconds each F, B and I that takes a message from another rank computes beyond the
    others, inside the timed action (module docstring)."""
    wait_share: float = 0.0
    """The share of a core a waiting rank takes where ranks share cores (module docstring)."""
    compute_scale: float = 1.0
    """What the compute actions of a distributed run take over their single-process time
    (>= 1): the ranks' compute measured on the calibration runs' timelines against the
    simulated (:mod:`pipeweave.measure.calibration_runs`)."""
    size_scales: tuple[tuple[int, float], ...] = ()
    """``(samples per micro-batch, factor >= 1)`` pairs, sorted: ``compute_scale`` times the
    factor is the scale of a compute action at that micro-batch size (:meth:`size_factor`;
    module docstring). Empty: one scale for every size."""
    notes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, table in (("per_action", self.per_action), ("per_block", self.per_block)):
            unknown = sorted(set(table) - set(ACTION_KINDS))
            if unknown:
                raise ValueError(f"runtime costs {what} has unknown kinds {unknown}; known: "
                                 f"{list(ACTION_KINDS)}")
            for kind, value in table.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not math.isfinite(value):
                    raise ValueError(f"runtime costs {what}[{kind!r}] must be a finite number "
                                     f"of seconds, got {value!r}")
        if isinstance(self.per_message, bool) or not isinstance(self.per_message, (int, float)) \
                or not math.isfinite(self.per_message) or self.per_message < 0:
            raise ValueError(f"runtime costs per_message must be a finite number of seconds "
                             f">= 0, got {self.per_message!r}")
        if isinstance(self.message_latency, bool) \
                or not isinstance(self.message_latency, (int, float)) \
                or not math.isfinite(self.message_latency) or self.message_latency < 0:
            raise ValueError(f"runtime costs message_latency must be a finite number of "
                             f"seconds >= 0, got {self.message_latency!r}")
        object.__setattr__(self, "message_latency", float(self.message_latency))
        _check_seconds("allreduce_latency", self.allreduce_latency)
        object.__setattr__(self, "allreduce_latency", float(self.allreduce_latency))
        _check_seconds("action_overhead", self.action_overhead)
        object.__setattr__(self, "action_overhead", float(self.action_overhead))
        _check_seconds("compute_per_action", self.compute_per_action)
        object.__setattr__(self, "compute_per_action", float(self.compute_per_action))
        _check_seconds("compute_per_receive", self.compute_per_receive)
        object.__setattr__(self, "compute_per_receive", float(self.compute_per_receive))
        _check_seconds("wait_share", self.wait_share, "a finite number >= 0 (the share of "
                       "a core a waiting rank takes)")
        object.__setattr__(self, "wait_share", float(self.wait_share))
        scale = self.compute_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale < 1:
            raise ValueError(f"runtime costs compute_scale must be a finite number >= 1, got "
                             f"{scale!r}")
        object.__setattr__(self, "compute_scale", float(scale))
        object.__setattr__(self, "size_scales", _checked_size_scales(self.size_scales))
        rate = self.allreduce_bandwidth
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not math.isfinite(rate) or rate <= 0):
            raise ValueError(f"runtime costs allreduce_bandwidth must be a finite number of "
                             f"bytes/s > 0 or null, got {rate!r}")
        object.__setattr__(self, "per_action", {k: float(v) for k, v in self.per_action.items()})
        object.__setattr__(self, "per_block", {k: float(v) for k, v in self.per_block.items()})
        object.__setattr__(self, "per_message", float(self.per_message))

    def action(self, kind: str, profiled: float, blocks: int) -> float:
        """One action of ``kind`` over ``blocks`` blocks whose profiled times sum to
        ``profiled``; never below a tenth of ``profiled`` (a fit is a line through noisy
        points, and a stage's work cannot vanish)."""
        if blocks <= 0:
            return profiled
        extra = self.per_action.get(kind, 0.0) + self.per_block.get(kind, 0.0) * (blocks - 1)
        return max(profiled + extra, profiled / 10)

    def size_factor(self, samples: int | None) -> float:
        """The factor on ``compute_scale`` at ``samples`` per micro-batch: linear in the
        logarithm of the size between two sizes of :attr:`size_scales`, the nearest one's
        outside them; 1 without a table or a size."""
        points = self.size_scales
        if not points or samples is None:
            return 1.0
        if samples <= points[0][0]:
            return points[0][1]
        for (low, low_factor), (high, high_factor) in zip(points, points[1:]):
            if samples <= high:
                share = math.log(samples / low) / math.log(high / low)
                return low_factor + share * (high_factor - low_factor)
        return points[-1][1]

    def all_reduce(self, parameter_bytes: float, replicas: int, ring: float) -> float:
        """Seconds of the all-reduce of ``parameter_bytes`` among ``replicas`` whose ring
        formula at the stage's link gives ``ring`` seconds (module docstring)."""
        if replicas <= 1:
            return 0.0
        if self.allreduce_bandwidth is None:
            return ring + 2 * (replicas - 1) * self.message_latency
        gathered = (replicas - 1) * parameter_bytes / self.allreduce_bandwidth
        return self.allreduce_latency + max(gathered, ring)

    def to_json(self) -> dict[str, Any]:
        return {"per_action": dict(self.per_action), "per_block": dict(self.per_block),
                "per_message": self.per_message, "message_latency": self.message_latency,
                "allreduce_latency": self.allreduce_latency,
                "allreduce_bandwidth": self.allreduce_bandwidth,
                "action_overhead": self.action_overhead,
                "compute_per_action": self.compute_per_action,
                "compute_per_receive": self.compute_per_receive,
                "wait_share": self.wait_share, "compute_scale": self.compute_scale,
                "size_scales": [list(pair) for pair in self.size_scales],
                "notes": dict(self.notes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RuntimeCosts":
        if not isinstance(data, Mapping):
            raise ValueError(f"runtime costs must be an object, got {data!r}")
        unknown = sorted(set(data) - {"per_action", "per_block", "per_message",
                                      "message_latency", "allreduce_latency",
                                      "allreduce_bandwidth", "action_overhead",
                                      "compute_per_action", "compute_per_receive",
                                      "wait_share", "compute_scale", "size_scales",
                                      "notes"})
        if unknown:
            raise ValueError(f"runtime costs have unknown fields {unknown}")
        return cls(per_action=dict(data.get("per_action") or {}),
                   per_block=dict(data.get("per_block") or {}),
                   per_message=data.get("per_message", 0.0),
                   message_latency=data.get("message_latency", 0.0),
                   allreduce_latency=data.get("allreduce_latency", 0.0),
                   allreduce_bandwidth=data.get("allreduce_bandwidth"),
                   action_overhead=data.get("action_overhead", 0.0),
                   compute_per_action=data.get("compute_per_action", 0.0),
                   compute_per_receive=data.get("compute_per_receive", 0.0),
                   wait_share=data.get("wait_share", 0.0),
                   compute_scale=data.get("compute_scale", 1.0),
                   size_scales=tuple(tuple(pair) for pair in data.get("size_scales") or ()),
                   notes=dict(data.get("notes") or {}))


def _check_seconds(name: str, value: Any,
                   what: str = "a finite number of seconds >= 0") -> None:
    """Refuse a cost that is not a finite number >= 0 (ValueError naming it and ``what`` it
    must be)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"runtime costs {name} must be {what}, got {value!r}")


def _checked_size_scales(table: Any) -> tuple[tuple[int, float], ...]:
    """``size_scales`` sorted by size, or a ValueError naming what is wrong: each pair a
    whole number of samples >= 1 and a finite factor >= 1, no size twice."""
    out: list[tuple[int, float]] = []
    for pair in table:
        size, factor = pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (None, None)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 \
                or isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                or not math.isfinite(factor) or factor < 1:
            raise ValueError(f"runtime costs size_scales entry {pair!r} must be [samples >= 1, "
                             f"factor >= 1]: a micro-batch size and its compute scale's factor")
        out.append((size, float(factor)))
    sizes = [size for size, _ in out]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"runtime costs size_scales name a size twice ({sorted(sizes)}); "
                         "give each micro-batch size once")
    return tuple(sorted(out))
