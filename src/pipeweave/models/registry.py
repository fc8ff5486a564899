"""Models as the pipeline sees them: an ordered tuple of blocks plus a mean loss.

A :class:`ModelSpec` is the only thing the partitioner and the runtime need to know about a
model.  Each block maps ONE tensor to ONE tensor, so any contiguous range ``blocks[i:j]`` can be a
pipeline stage; ``loss_fn(output, target)`` is a MEAN over the batch, so accumulating gradients
over micro-batches of size ``m`` out of a batch of ``B`` means summing ``loss * m / B``.

Built-in models come from :func:`build_model`; users wrap their own with
:meth:`ModelSpec.from_blocks`.

Blocks may share a parameter object (tied word embeddings: the token embedding and the LM
head). :attr:`ModelSpec.tied` lists every such group by global name; the runtime deep-copies
each stage's blocks, so a group split over stages becomes a copy per holding stage, which the
runtime keeps one logical parameter by summing the copies' gradients before every update
(``runtime/execution/ties.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from pipeweave.models.cnn import CNNConfig, MLPConfig, classification_loss, cnn_blocks, mlp_blocks
from pipeweave.models.gpt import GPT_PRESETS, GPTConfig, gpt_blocks, gpt_init, gpt_loss
from pipeweave.model_names import BUILT_IN, PROVIDED, add_model_name, model_names
from pipeweave.models.materialize import Init, is_meta, materialize, on_meta

__all__ = ["LossFn", "ModelSpec", "available_models", "build_model", "default_seq_len",
           "register_model"]

LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(output, target) -> scalar``, a mean over the batch."""


@dataclass(frozen=True)
class ModelSpec:
    """A model cut into pipeline blocks, with its loss and default dataset."""

    name: str
    """Model name, e.g. ``"gpt-tiny"`` or ``"custom"``."""

    blocks: tuple[nn.Module, ...]
    """Blocks in execution order; each takes one tensor and returns one tensor."""

    loss_fn: LossFn
    """``loss_fn(output, target) -> scalar`` tensor, a MEAN over the batch."""

    block_names: tuple[str, ...]
    """One unique name per block, e.g. ``("embed", "layer0.attn", ..., "head")``."""

    dataset: str | None = None
    """Name of the default dataset for :func:`pipeweave.data.build_dataset`; ``None`` for
    user models that bring their own data."""

    init: Init | None = None
    """Initialises one block made real from the meta device, in place, from the global
    generator (:mod:`pipeweave.models.materialize`); None: every submodule's
    ``reset_parameters()``. Unused for blocks that come with values."""

    seed: int = 0
    """Seeds each meta block's initialisation, with the block's name
    (:func:`~pipeweave.models.materialize.block_seed`)."""

    tied: tuple[tuple[str, ...], ...] = field(init=False, default=())
    """Parameters shared by several blocks, found on construction: one group of global names
    (``"<block index>.<name in the block>"``, block order) per shared parameter object, e.g.
    ``(("0.wte.weight", "5.lm_head.weight"),)`` for tied word embeddings. Empty for most
    models. A stage deep-copies its blocks, so a group split over stages has a copy per holding
    stage; the runtime sums the copies' gradients before each update, which keeps them one
    logical parameter (``runtime/execution/ties.py``)."""

    def __post_init__(self) -> None:
        # Accept any sequence, store tuples so the spec stays immutable.
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "block_names", tuple(self.block_names))
        if not self.blocks:
            raise ValueError(f"ModelSpec {self.name!r} has no blocks; pass at least one nn.Module")
        for i, block in enumerate(self.blocks):
            if not isinstance(block, nn.Module):
                raise TypeError(
                    f"ModelSpec {self.name!r}: block {i} is a {type(block).__name__}, "
                    f"not an nn.Module; wrap functions in an nn.Module"
                )
        if len(self.block_names) != len(self.blocks):
            raise ValueError(
                f"ModelSpec {self.name!r}: {len(self.block_names)} block_names for "
                f"{len(self.blocks)} blocks; pass one name per block"
            )
        if len(set(self.block_names)) != len(self.block_names):
            dupes = sorted({n for n in self.block_names if self.block_names.count(n) > 1})
            raise ValueError(f"ModelSpec {self.name!r}: duplicate block names {dupes}")
        if not callable(self.loss_fn):
            raise TypeError(
                f"ModelSpec {self.name!r}: loss_fn={self.loss_fn!r} is not callable; pass "
                f"a function (output, target) -> scalar mean loss"
            )
        object.__setattr__(self, "tied", _shared_parameters(self.blocks))

    def tied_blocks(self) -> tuple[tuple[int, ...], ...]:
        """For each group in :attr:`tied`, the indices of the blocks that hold it."""
        return tuple(tuple(sorted({int(name.partition(".")[0]) for name in group}))
                     for group in self.tied)

    @classmethod
    def from_blocks(
        cls,
        blocks: Sequence[nn.Module] | nn.Sequential,
        loss_fn: LossFn,
        name: str = "custom",
        *,
        block_names: Sequence[str] | None = None,
        dataset: str | None = None,
        init: Init | None = None,
        seed: int = 0,
    ) -> ModelSpec:
        """Wrap a user's model: a list of blocks or an ``nn.Sequential`` (its children become
        the blocks, named by their keys unless ``block_names`` is given). Blocks built under
        ``torch.device("meta")`` are made real per stage with ``init`` and ``seed``
        (:attr:`init`, :attr:`seed`)."""
        if isinstance(blocks, nn.Sequential):
            items = list(blocks.named_children())
            modules = [m for _, m in items]
            default_names = [k for k, _ in items]
        elif isinstance(blocks, nn.Module):
            raise TypeError(
                f"from_blocks got a single {type(blocks).__name__}; pass a list of blocks or an "
                f"nn.Sequential (use [module] for a one-block model)"
            )
        else:
            modules = list(blocks)
            default_names = [str(i) for i in range(len(modules))]
        names = default_names if block_names is None else list(block_names)
        return cls(
            name=name,
            blocks=tuple(modules),
            loss_fn=loss_fn,
            block_names=tuple(names),
            dataset=dataset,
            init=init,
            seed=seed,
        )

    def materialized(self, device: torch.device | str = "cpu") -> ModelSpec:
        """This model with every block real on ``device`` (blocks on the meta device made
        real and initialised per block, :mod:`pipeweave.models.materialize`); ``self`` when
        no block is on meta. The values equal those of any stage built alone."""
        if not any(is_meta(block) for block in self.blocks):
            return self
        return dataclasses.replace(self, blocks=tuple(self.stage_blocks(0, len(self.blocks),
                                                                        device)))

    def stage_blocks(self, start: int, end: int, device: torch.device | str) -> list[nn.Module]:
        """Real copies of ``blocks[start:end]`` on ``device`` (what a stage trains): meta
        blocks made real and initialised per block, the others deep-copied."""
        return materialize(self.blocks, self.block_names, range(start, end), device=device,
                           tied=self.tied, init=self.init, seed=self.seed)

    def sequential(self) -> nn.Sequential:
        """An ``nn.Sequential`` over the SAME block objects (shared parameters), keyed
        ``"0"``, ``"1"``, ... by block index, for non-pipelined reference training."""
        return nn.Sequential(*self.blocks)


def _shared_parameters(blocks: Sequence[nn.Module]) -> tuple[tuple[str, ...], ...]:
    """Groups of global names of the parameter objects that more than one block holds."""
    holders: dict[int, list[str]] = {}
    for index, block in enumerate(blocks):
        for name, parameter in block.named_parameters():  # each object once per block
            holders.setdefault(id(parameter), []).append(f"{index}.{name}")
    return tuple(tuple(names) for names in holders.values()
                 if len({name.partition(".")[0] for name in names}) > 1)


@dataclass(frozen=True)
class _Entry:
    config: Any
    build: Callable[[Any], Built]
    loss_fn: LossFn
    dataset: str
    meta: bool = False
    """``build`` runs on the meta device (blocks made real per stage) rather than with values."""
    skip_init: bool = False
    """A meta build runs no init function (:func:`~pipeweave.models.materialize.on_meta`):
    for pipeweave's own models, whose code is imported before the build. Not for a library
    imported during its build (transformers keeps torch's init functions at import time)."""


Built = tuple[list[nn.Module], list[str]] | tuple[list[nn.Module], list[str], Init | None]
"""What a registered ``build(config)`` returns: blocks, names and (a meta build) the
initialiser of one block made real (None: ``reset_parameters()``)."""


def _gpt_build(config: GPTConfig) -> Built:
    blocks, names = gpt_blocks(config)
    return blocks, names, gpt_init(config)


_MODELS: dict[str, _Entry] = {
    **{
        name: _Entry(config, _gpt_build, gpt_loss, "stdlib-bytes", meta=True, skip_init=True)
        for name, config in GPT_PRESETS.items()
    },
    "mlp": _Entry(MLPConfig(), mlp_blocks, classification_loss, "digits", meta=True,
                  skip_init=True),
    "cnn": _Entry(CNNConfig(), cnn_blocks, classification_loss, "digits", meta=True,
                  skip_init=True),
}


assert set(_MODELS) == set(BUILT_IN), "model_names.BUILT_IN must name what _MODELS builds"


def register_model(name: str, *, config: Any, build: Callable[[Any], Built],
                   loss_fn: LossFn, dataset: str, meta: bool = False) -> None:
    """Add a named model: ``config`` a frozen dataclass of its defaults (its fields are the
    options :func:`build_model` accepts), ``build(config) -> (blocks, names)`` drawing any
    random initialisation from the global torch RNG. ``meta=True``: ``build`` runs under
    ``torch.device("meta")`` and returns ``(blocks, names, init)``, ``init`` the initialiser
    of one block made real (:attr:`ModelSpec.init`; None: ``reset_parameters()``), so that
    every rank builds only its stage; otherwise every rank builds the whole model."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"register_model({name!r}): config={config!r} is not a dataclass "
                        f"instance; pass the model's default config object")
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered; choose another name")
    _MODELS[name] = _Entry(config, build, loss_fn, dataset, meta)
    add_model_name(name)


def _entry(name: str) -> _Entry | None:
    if name not in _MODELS and name in PROVIDED:
        importlib.import_module(PROVIDED[name])  # registers its names
        if name not in _MODELS:
            raise RuntimeError(f"{PROVIDED[name]} did not register model {name!r}")
    return _MODELS.get(name)


def available_models() -> list[str]:
    """Names accepted by :func:`build_model`, sorted (:func:`pipeweave.model_names.model_names`,
    which knows them without torch)."""
    return model_names()


def default_seq_len(name: str, **overrides: Any) -> int | None:
    """Tokens per sample for a sequence model's data (its config's ``seq_len`` after
    ``overrides``); None for models without one."""
    entry = _entry(name)
    if entry is None:
        raise ValueError(f"unknown model {name!r}; choose one of {available_models()}")
    value = overrides.get("seq_len", getattr(entry.config, "seq_len", None))
    return value if isinstance(value, int) else None


def build_model(
    name: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = False,
    **overrides: Any,
) -> ModelSpec:
    """Build a named model with deterministic initialisation.

    ``meta=True``: the blocks on the meta device (no storage), to be made real per stage
    (:meth:`ModelSpec.stage_blocks`, :mod:`pipeweave.models.materialize`); False: the whole
    model real on the CPU, with the same values. Each block is initialised from a seed derived
    from ``seed`` and its name, so its values do not depend on which other blocks are built.

    ``overrides`` replace fields of the preset's config (``GPTConfig``, ``MLPConfig``,
    ``CNNConfig``, or ``pipeweave.hf.HFPreset`` for the ``hf-*`` models), e.g. ``build_model("gpt-tiny", n_layers=2, sublayer=False)``.  The weights
    depend only on ``name``, ``overrides`` and ``seed``; the global torch RNG is left untouched.
    """
    entry = _entry(name)
    if entry is None:
        raise ValueError(f"unknown model {name!r}; choose one of {available_models()}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is not a floating dtype; pass e.g. torch.float64")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed={seed!r} is not an int; pass e.g. seed=0")
    fields = {f.name for f in dataclasses.fields(entry.config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for model {name!r}; "
            f"{type(entry.config).__name__} accepts {sorted(fields)}"
        )
    config = dataclasses.replace(entry.config, **overrides)
    if entry.meta:
        with on_meta() if entry.skip_init else torch.device("meta"):
            built = entry.build(config)
    else:  # built with values, whole
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = entry.build(config)
    blocks, names = built[0], built[1]
    init = built[2] if len(built) == 3 else None
    for block in blocks:
        block.to(dtype)
    spec = ModelSpec(name=name, blocks=tuple(blocks), loss_fn=entry.loss_fn,
                     block_names=tuple(names), dataset=entry.dataset, init=init, seed=seed)
    return spec if meta else spec.materialized("cpu")
