"""``blocks(model)``: a Hugging Face causal LM as a pipeweave :class:`ModelSpec`, no tracing.

The model's structure is read from its attributes (``transformer.wte``/``h``/``ln_f`` for
GPT-2; ``model.embed_tokens``/``layers``/``norm``/``rotary_emb`` for the Llama family) and its
own submodules are wrapped in the blocks of :mod:`pipeweave.hf.layers`.
"""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

from torch import nn

from ..models import ModelSpec
from .layers import (AttentionHalf, CausalContext, DecoderLayer, GPT2Embedding, Head, MLPHalf,
                     MaskFunction, TokenEmbedding)
from .loss import CausalLMLoss

__all__ = ["SUPPORTED", "blocks", "family_of", "require_transformers"]

SUPPORTED = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
             "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
"""Families the adapter knows (``config.model_type``) and the model class it takes."""

_HALVES = {"gpt2": (("ln_1", "attn"), ("ln_2", "mlp"))}
"""Each family's (norm, attention) and (norm, MLP) attribute names; the rest: Llama's."""
_LLAMA_HALVES = (("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"))


class TransformersMissing(ImportError, ValueError):
    """``transformers`` is not installed: an ImportError, and a ValueError so that the command
    line shows it as one line with the fix (a user's setup, not a bug)."""


def require_transformers() -> ModuleType:
    """The ``transformers`` module, or :class:`TransformersMissing` saying how to install it."""
    try:
        import transformers
    except ImportError as error:
        raise TransformersMissing("pipeweave.hf needs the transformers package: pip install -e "
                                  "'.[hf]' (or pip install transformers)") from error
    return transformers


def family_of(model: Any) -> str:
    """``"gpt2"``, ``"llama"``, ``"qwen2"`` or ``"mistral"``; TypeError for other models."""
    transformers = require_transformers()
    for family, class_name in SUPPORTED.items():
        if isinstance(model, getattr(transformers, class_name)):
            return family
    raise TypeError(f"pipeweave.hf.blocks takes a {', '.join(SUPPORTED.values())} (decoder-only "
                    f"causal LMs with an LM head); got {type(model).__name__}")


def blocks(model: Any, *, sublayer: bool = False, padding: bool = False,
           name: str | None = None, dataset: str | None = None) -> ModelSpec:
    """The pipeline blocks of a ``transformers`` causal LM, wrapping its own modules.

    Blocks: ``embed`` (token, and for GPT-2 position, embeddings), one ``layer<i>`` per decoder
    layer (``sublayer=True``: ``layer<i>.attn`` and ``layer<i>.ffn``, its attention and MLP
    halves, AutoPipe's granularity), and ``head`` (final norm and LM head). Only the hidden
    state crosses a block boundary; each attention block recomputes position ids, the causal
    mask and (Llama family) the rotary embedding from its shape, as the model's forward does.
    ``loss_fn`` is the model's own causal-LM loss (:class:`~.loss.CausalLMLoss`): targets are
    the input ids, as ``model(ids, labels=ids)`` takes them (dataset ``stdlib-bytes-labels``).

    ``padding=True``: the input is ``int64 [B, 2, T]``, the ids and HF's ``attention_mask``
    stacked on dim 1, and the mask rides with the hidden state to every attention block
    (:mod:`.layers`); pad positions' labels should be ``-100``.

    A model built under ``torch.device("meta")`` has no values yet: each rank makes real only
    its stage's blocks, initialised by the model's own ``_init_weights`` (:func:`init_module`)
    from a seed per block (:mod:`pipeweave.models.materialize`).

    The blocks hold the model's modules, not copies: ``spec.sequential()`` is the model, and
    training it trains the model. pipeweave's runtime, though, deep-copies each stage's blocks
    into the rank that runs it. Tied word embeddings (GPT-2 by default: ``wte`` and
    ``lm_head`` are one weight) are listed in ``spec.tied``; on different stages each holds a
    copy, and the runtime sums the copies' gradients before every update, which keeps them one
    parameter (``runtime/execution/ties.py``).

    ``name`` defaults to ``"hf-<family>"``; ``dataset`` names the spec's default dataset (None:
    the user brings their data).
    """
    if not isinstance(sublayer, bool):
        raise TypeError(f"sublayer={sublayer!r}; pass True (attention and MLP blocks) or False")
    if not isinstance(padding, bool):
        raise TypeError(f"padding={padding!r}; pass True (inputs carry an attention_mask) or "
                        f"False")
    family = family_of(model)
    parts = _parts(model, family, padding)
    found: list[nn.Module] = [parts.embed]
    names = ["embed"]
    for index, layer in enumerate(parts.layers[: model.config.num_hidden_layers]):
        blocks_of_layer = _layer_blocks(model, family, index, layer, parts.rotary,
                                        sublayer=sublayer, padding=padding)
        found += blocks_of_layer
        names += ([f"layer{index}.attn", f"layer{index}.ffn"] if sublayer
                  else [f"layer{index}"])
    found.append(Head(parts.norm, model.lm_head, padding))
    names.append("head")
    return ModelSpec(name=name or f"hf-{family}", blocks=tuple(found),
                     loss_fn=CausalLMLoss(_loss_function(model)),
                     block_names=tuple(names), dataset=dataset, init=partial(init_module, model))


class _Parts(NamedTuple):
    """The modules of a causal LM that the blocks wrap."""

    embed: nn.Module
    layers: list[Any]
    """The decoder layers."""
    norm: Any
    """The final norm."""
    rotary: Any
    """The rotary embedding (Llama family; None for GPT-2)."""


def _parts(model: Any, family: str, padding: bool) -> _Parts:
    config: Any = model.config
    if family == "gpt2":
        if config.add_cross_attention:
            raise ValueError("this GPT-2 has cross-attention (add_cross_attention=True), which "
                             "needs encoder states a pipeline block cannot carry; use a "
                             "decoder-only config")
        base: Any = model.transformer
        return _Parts(GPT2Embedding(base.wte, base.wpe, base.drop, padding), list(base.h),
                      base.ln_f, None)
    base = model.model
    return _Parts(TokenEmbedding(base.embed_tokens, padding), list(base.layers), base.norm,
                  base.rotary_emb)


def _layer_blocks(model: Any, family: str, index: int, layer: Any, rotary: Any, *,
                  sublayer: bool, padding: bool) -> list[nn.Module]:
    """Decoder layer ``index`` as one block, or (``sublayer``) its attention and MLP halves."""
    masking: Any = require_transformers().masking_utils
    config: Any = model.config
    context = CausalContext(config, _mask_function(family, config, index, masking), rotary)
    if not sublayer:
        return [DecoderLayer(layer, context, padding)]
    (norm1, attention), (norm2, mlp) = _HALVES.get(family, _LLAMA_HALVES)
    return [AttentionHalf(getattr(layer, norm1), getattr(layer, attention), context, padding),
            MLPHalf(getattr(layer, norm2), getattr(layer, mlp), padding)]


def init_module(model: Any, module: nn.Module, name: str = "") -> None:
    """The model's own initialisation of one module of a block made real from the meta
    device: its ``_init_weights``, which the materialiser calls children before parents as
    ``init_weights`` does (GPT-2's scaled ``c_proj`` after its plain one; the rotary
    frequencies recomputed)."""
    model._init_weights(module)


def _loss_function(model: Any) -> Any:
    """``model.loss_function``; None (CausalLMLoss's default, the same ``ForCausalLM`` loss)
    where the model names no loss type (GPT2LMHeadModel), which the property would log a
    warning about before falling back to that loss."""
    if hasattr(model, "_loss_function") or getattr(model, "loss_type", None) is not None:
        return model.loss_function
    return None


def _mask_function(family: str, config: Any, index: int, masking: Any) -> MaskFunction:
    """The mask HF's forward gives layer ``index``: sliding-window where the config says so
    (Qwen2 per layer, ``layer_types``; Mistral for all layers, ``sliding_window``)."""
    if family == "qwen2":
        sliding = config.layer_types[index] == "sliding_attention"
    elif family == "mistral":
        sliding = config.sliding_window is not None
    else:
        sliding = False
    function: MaskFunction = (masking.create_sliding_window_causal_mask if sliding
                              else masking.create_causal_mask)
    return function
