"""The profile: per-block costs of one model on one device, as plain JSON.

A profile is what the planners read (DESIGN.md "profile -> plan"). It lists, for every block
of the model in pipeline order, what one micro-batch costs::

    forward, backward     seconds for one micro-batch of ``batch_size`` samples
    output_bytes          the block's output tensor (what crosses a stage boundary after it;
                          its gradient, sent back, has the same size)
    activation_bytes      what the block keeps from its forward until its backward
    parameter_bytes       its weights (all-reduced when its stage is replicated)
    optimizer_bytes       the optimizer's state for those weights (Adam: 2x parameters)
    peak_memory_bytes     most memory the block's forward+backward allocated above its
                          input (0 when unknown)
    pending_bytes         bytes a split backward keeps from its input-gradient half to its
                          weight-gradient half besides the activations (the gradients of the
                          parameter-holding modules' outputs; 0 when unknown)
    recorded_bytes        bytes a split backward keeps from the forward to its weight-gradient
                          half besides ``activation_bytes`` (those outputs, where autograd
                          does not save them itself; 0 when unknown)
    update                seconds of one optimizer step on the block's parameters (0 when
                          unknown)
    weight_grad           seconds of the weight-gradient half of a split backward (``W``) and
    input_grad            of its input-gradient half (``I``), measured with
                          :mod:`pipeweave.split_backward` (0 when unknown; together they usually
                          exceed ``backward``: two passes instead of one)

and optionally the measured point-to-point ``link`` (bandwidth in bytes/s, latency in s), the
``runtime`` costs a pipeline stage adds to its blocks' (:mod:`.runtime_costs`), and the
model's ``ties``: parameters several blocks share (tied word embeddings), each with the
blocks that hold it and its bytes. Every holding block counts the tied parameter in its
``parameter_bytes`` (each was measured alone); :meth:`Profile.shared_bytes` is what a stage
holding several of them counts twice. A profile without ``ties`` (written before they were
recorded) loads with none.

``apc_bytes_per_second`` is how many float32 bytes per second APC's codec (WPipe's automatic
precision compression, ``pipeweave/apc.py``: scale and convert to float16, then
back to float32) gets through, encode and decode together, on the profiled device; ``null``
(every profile written before it was measured, and imported ones) means unknown, and the
planners then leave the conversion unpriced (free), as they did before.

JSON form (``schema`` is checked on load; a newer schema is refused, not misread)::

    {"schema": "pipeweave.profile/1", "model": "gpt-tiny", "batch_size": 4, "device": "cpu",
     "source": "measured", "input_bytes": 2048, "apc_bytes_per_second": 1.6e9,
     "link": {"bandwidth": 2.1e9, "latency": 4.5e-05},
     "blocks": [{"name": "embed", "forward": 1.2e-4, "backward": 2.0e-4, "output_bytes": 65536,
                 "activation_bytes": 65536, "parameter_bytes": 81920, "optimizer_bytes": 163840,
                 "peak_memory_bytes": 0, "update": 3.1e-05, "weight_grad": 9.5e-05,
                 "input_grad": 1.3e-04}, ...],
     "ties": [{"blocks": [0, 9], "parameter_bytes": 3145728,
               "names": ["0.wte.weight", "9.lm_head.weight"]}],
     "metadata": {...}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .runtime_costs import RuntimeCosts

__all__ = ["SCHEMA", "BlockProfile", "LinkProfile", "Profile", "TieProfile"]

SCHEMA = "pipeweave.profile/1"
"""Schema tag written into every profile and required on load."""

EXCLUDED = "parameters excluded"
"""``metadata["activation_bytes"]`` of a measured profile whose activation bytes leave out the
blocks' own parameters (every profile measured since; see :attr:`Profile.stash_bytes`)."""

_BLOCK_NUMBERS = ("forward", "backward", "output_bytes", "activation_bytes", "parameter_bytes",
                  "optimizer_bytes", "peak_memory_bytes", "update", "weight_grad", "input_grad",
                  "pending_bytes", "recorded_bytes", "tp_split_parameter_bytes",
                  "tp_split_activation_bytes", "tp_forward_reduces", "tp_backward_reduces",
                  "tp_split_output_bytes")
_TP = ("tp_split_parameter_bytes", "tp_split_activation_bytes", "tp_forward_reduces",
       "tp_backward_reduces", "tp_split_output_bytes")
_OPTIONAL = frozenset({"optimizer_bytes", "peak_memory_bytes", "update", "weight_grad",
                       "input_grad", "pending_bytes", "recorded_bytes", *_TP})


@dataclass(frozen=True)
class BlockProfile:
    """Costs of one block for one micro-batch (see the module docstring for each field)."""

    name: str
    forward: float
    backward: float
    output_bytes: float
    activation_bytes: float
    parameter_bytes: float
    optimizer_bytes: float = 0.0
    peak_memory_bytes: float = 0.0
    update: float = 0.0
    weight_grad: float = 0.0
    input_grad: float = 0.0
    pending_bytes: float = 0.0
    recorded_bytes: float = 0.0
    tp_split_parameter_bytes: float = 0.0
    tp_split_activation_bytes: float = 0.0
    tp_forward_reduces: float = 0.0
    tp_backward_reduces: float = 0.0
    tp_split_output_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a block profile needs a non-empty name, got {self.name!r}")
        for name in _BLOCK_NUMBERS:
            object.__setattr__(self, name, _number(f"block {self.name!r} {name}", getattr(self, name)))
        for part, whole in (("tp_split_parameter_bytes", "parameter_bytes"),
                            ("tp_split_activation_bytes", "activation_bytes")):
            if getattr(self, part) > getattr(self, whole):
                raise ValueError(f"block {self.name!r} {part}={getattr(self, part):g} exceeds "
                                 f"{whole}={getattr(self, whole):g}; give at most the whole")

    @property
    def compute(self) -> float:
        """Forward plus backward time (PipeDream's ``T_l``; AutoPipe's ``f_i + b_i``)."""
        return self.forward + self.backward


@dataclass(frozen=True)
class LinkProfile:
    """A point-to-point link: ``time(bytes) = latency + bytes / bandwidth``."""

    bandwidth: float
    """Bytes per second."""
    latency: float = 0.0
    """Seconds per message."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", _number("link bandwidth", self.bandwidth))
        object.__setattr__(self, "latency", _number("link latency", self.latency))
        if self.bandwidth <= 0:
            raise ValueError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth}")

    def transfer_time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class TieProfile:
    """One parameter several blocks share (``ModelSpec.tied``)."""

    blocks: tuple[int, ...]
    """The blocks holding it, ascending (at least two)."""
    parameter_bytes: float
    """Its size; every holding block's ``parameter_bytes`` includes it."""
    names: tuple[str, ...] = ()
    """Global names of its uses (``"<block>.<name in the block>"``), for messages."""

    def __post_init__(self) -> None:
        blocks = tuple(self.blocks)
        if (any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in blocks)
                or len(set(blocks)) < 2 or list(blocks) != sorted(set(blocks))):
            raise ValueError(f"a tie's blocks must be two or more distinct block indices in "
                             f"ascending order, got {list(blocks)}")
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        object.__setattr__(self, "parameter_bytes",
                           _number("tie parameter_bytes", self.parameter_bytes))

    def stages(self, bounds: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """The stages of ``bounds`` holding it, ascending."""
        return tuple(s for s, (a, e) in enumerate(bounds) if any(a <= b < e for b in self.blocks))


@dataclass(frozen=True)
class Profile:
    """Per-block costs of a model, in pipeline order (see the module docstring).

    Attributes:
        blocks: one :class:`BlockProfile` per block.
        model: the model's name (checked against ``--model`` when both are given).
        batch_size: samples per profiled micro-batch (``None`` when unknown).
        device: where it was measured (``"cpu"``, ``"cuda"``, or e.g. ``"V100"``).
        source: ``"measured"``, ``"pipedream-graph"`` or ``"synthetic"``.
        input_bytes: bytes of the model's input micro-batch.
        link: measured point-to-point link between two ranks, if any.
        runtime: the runtime's fixed costs per action and block (:mod:`.runtime_costs`), if
            measured.
        metadata: free-form notes (warm-up and repeat counts, torch version, ...).
        ties: parameters several blocks share (:class:`TieProfile`).
        apc_bytes_per_second: float32 bytes per second through APC's encode and decode
            (module docstring); ``None``: unknown, the conversion is not priced.
    """

    blocks: tuple[BlockProfile, ...]
    model: str = "custom"
    batch_size: int | None = None
    device: str = "unknown"
    source: str = "measured"
    input_bytes: float = 0.0
    link: LinkProfile | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    runtime: RuntimeCosts | None = None
    ties: tuple[TieProfile, ...] = ()
    apc_bytes_per_second: float | None = None

    def __post_init__(self) -> None:
        if self.apc_bytes_per_second is not None:
            rate = _number("profile apc_bytes_per_second", self.apc_bytes_per_second)
            if rate <= 0:
                raise ValueError(f"profile apc_bytes_per_second must be > 0 or null, got {rate}; "
                                 "leave it null when unknown")
            object.__setattr__(self, "apc_bytes_per_second", rate)
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "ties", tuple(self.ties))
        for tie in self.ties:
            if not isinstance(tie, TieProfile) or tie.blocks[-1] >= len(self.blocks):
                raise ValueError(f"profile of {self.model!r}: tie {tie!r} is not a TieProfile "
                                 f"of blocks below {len(self.blocks)}; give the indices of the "
                                 f"blocks that share the parameter")
        if not self.blocks:
            raise ValueError(f"profile of {self.model!r} has no blocks; a profile needs >= 1 block")
        for index, block in enumerate(self.blocks):
            if not isinstance(block, BlockProfile):
                raise TypeError(f"profile block {index} is a {type(block).__name__}, "
                                "not a BlockProfile")
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"profile of {self.model!r} has duplicate block names {dupes}")
        if self.batch_size is not None and (isinstance(self.batch_size, bool)
                                            or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise ValueError(f"profile batch_size must be an integer >= 1 or null, "
                             f"got {self.batch_size!r}")
        object.__setattr__(self, "input_bytes", _number("profile input_bytes", self.input_bytes))

    # -- columns -----------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def forward(self) -> tuple[float, ...]:
        return tuple(b.forward for b in self.blocks)

    @property
    def backward(self) -> tuple[float, ...]:
        return tuple(b.backward for b in self.blocks)

    @property
    def compute(self) -> tuple[float, ...]:
        return tuple(b.compute for b in self.blocks)

    @property
    def output_bytes(self) -> tuple[float, ...]:
        return tuple(b.output_bytes for b in self.blocks)

    @property
    def parameter_bytes(self) -> tuple[float, ...]:
        return tuple(b.parameter_bytes for b in self.blocks)

    @property
    def stash_bytes(self) -> tuple[float, ...]:
        """Per block, what one micro-batch leaves for its backward: ``activation_bytes``, less
        the block's parameters in a profile that pipeweave's profiler wrote before it left
        them out (its metadata has ``peak_memory`` but not ``activation_bytes:
        "parameters excluded"``): a Linear saves its own weight, a storage held once, not per
        micro-batch. Profiles built by hand or imported are taken as they are."""
        written_before = ("peak_memory" in self.metadata
                          and self.metadata.get("activation_bytes") != EXCLUDED)
        if not written_before:
            return tuple(b.activation_bytes for b in self.blocks)
        return tuple(max(b.activation_bytes - b.parameter_bytes, 0.0) for b in self.blocks)

    def shared_bytes(self, start: int, end: int) -> float:
        """Parameter bytes the blocks ``[start, end)`` count more than once: a tie held by
        ``j > 1`` of them is one parameter there, counted ``j`` times in their
        ``parameter_bytes``."""
        return sum((held - 1) * tie.parameter_bytes for tie in self.ties
                   if (held := sum(start <= b < end for b in tie.blocks)) > 1)

    def stage_parameter_bytes(self, start: int, end: int) -> float:
        """The parameter bytes a stage of blocks ``[start, end)`` holds (ties once)."""
        return sum(b.parameter_bytes for b in self.blocks[start:end]) \
            - self.shared_bytes(start, end)

    def with_link(self, link: LinkProfile | None) -> "Profile":
        return replace(self, link=link)

    # -- serialisation -------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "batch_size": self.batch_size,
            "device": self.device,
            "source": self.source,
            "input_bytes": self.input_bytes,
            "apc_bytes_per_second": self.apc_bytes_per_second,
            "link": None if self.link is None else {"bandwidth": self.link.bandwidth,
                                                    "latency": self.link.latency},
            "blocks": [{f.name: getattr(b, f.name) for f in fields(b)
                        if f.name not in _TP or getattr(b, f.name)} for b in self.blocks],
            "metadata": dict(self.metadata),
            **({} if self.runtime is None else {"runtime": self.runtime.to_json()}),
            **({"ties": [{"blocks": list(t.blocks), "parameter_bytes": t.parameter_bytes,
                          "names": list(t.names)} for t in self.ties]} if self.ties else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, origin: str = "profile") -> "Profile":
        """Parse and validate; every problem is a ``ValueError`` naming ``origin`` and the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{origin}: expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"{origin}: schema {schema!r} is not {SCHEMA!r}; write the profile "
                             "with `pipeweave profile` (or import PipeDream's graph.txt)")
        known = {"schema", "model", "batch_size", "device", "source", "input_bytes", "link",
                 "blocks", "metadata", "ties", "apc_bytes_per_second",
                 "runtime"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{origin}: unknown fields {unknown}; known: {sorted(known)}")
        blocks = _blocks_from_json(data.get("blocks"), origin)
        ties = _ties_from_json(data.get("ties") or [], origin)
        link = data.get("link")
        runtime = data.get("runtime")
        try:
            return cls(
                blocks=tuple(blocks),
                model=str(data.get("model", "custom")),
                batch_size=data.get("batch_size"),
                device=str(data.get("device", "unknown")),
                source=str(data.get("source", "measured")),
                input_bytes=data.get("input_bytes", 0.0),
                link=None if link is None else LinkProfile(**link),
                metadata=dict(data.get("metadata") or {}),
                runtime=None if runtime is None else RuntimeCosts.from_json(runtime),
                ties=ties,
                apc_bytes_per_second=data.get("apc_bytes_per_second"),
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"{origin}: {error}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        """Read a JSON profile (or, for a ``.txt`` file, PipeDream's ``graph.txt``)."""
        from ..files import read_json, read_text

        path = Path(path)
        what, fix = (f"profile file {path}",
                     "create one with `pipeweave profile --model NAME --json-out FILE`")
        if path.suffix == ".txt":
            from .pipedream_graph import parse_pipedream_graph

            return parse_pipedream_graph(read_text(path, what=what, fix=fix), name=path.stem)
        return cls.from_json(read_json(path, what=what, fix=fix), origin=what)


def _number(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _blocks_from_json(raw_blocks: Any, origin: str) -> list[BlockProfile]:
    if not isinstance(raw_blocks, Sequence) or isinstance(raw_blocks, (str, bytes)):
        raise ValueError(f"{origin}: 'blocks' must be a list of block objects")
    block_fields = {f.name for f in fields(BlockProfile)}
    required = block_fields - _OPTIONAL
    blocks = []
    for index, raw in enumerate(raw_blocks):
        if not isinstance(raw, Mapping):
            raise ValueError(f"{origin}: block {index} must be an object, got {raw!r}")
        missing = sorted(required - set(raw))
        extra = sorted(set(raw) - block_fields)
        if missing or extra:
            raise ValueError(f"{origin}: block {index} has missing fields {missing} and "
                             f"unknown fields {extra}; each block needs {sorted(required)}")
        try:
            blocks.append(BlockProfile(**raw))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{origin}: block {index}: {error}") from None
    return blocks


def _ties_from_json(raw_ties: Any, origin: str) -> tuple[TieProfile, ...]:
    if not isinstance(raw_ties, Sequence) or isinstance(raw_ties, (str, bytes)) or \
            not all(isinstance(t, Mapping) for t in raw_ties):
        raise ValueError(f"{origin}: 'ties' must be a list of objects with blocks, "
                         f"parameter_bytes and names, got {raw_ties!r}")
    try:
        return tuple(TieProfile(blocks=tuple(t["blocks"]), parameter_bytes=t["parameter_bytes"],
                                names=tuple(t.get("names", ()))) for t in raw_ties)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{origin}: ties: {error!s}; each tie needs blocks (indices) and "
                         "parameter_bytes") from None
