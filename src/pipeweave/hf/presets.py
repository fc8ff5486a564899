"""Small random-weight Hugging Face models by name: ``hf-gpt2``, ``hf-llama``, ``hf-qwen2``,
``hf-mistral`` (registered with :func:`pipeweave.models.build_model` on import).

Each is built from transformers' own config and model classes on the meta device, each rank
making its stage real with the model's own initialisation seeded per block (nothing is
downloaded): vocabulary 256, byte-level over the built-in ``stdlib-bytes-labels``
corpus, no dropout, untied word embeddings unless asked (a tie keeps the embedding and the head
in one stage; see :func:`pipeweave.hf.blocks`). ``config_file`` takes a user's ``config.json``
instead of the small shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from ..models import register_model
from ..models.materialize import Init
from .adapter import SUPPORTED, blocks, require_transformers
from .loss import CausalLMLoss
from .pretrained import PretrainedInit, check_pretrained

__all__ = ["ATTENTION", "DATASET", "HFPreset", "PRESETS", "config_family", "exported_names",
           "hf_config", "hf_model"]

DATASET = "stdlib-bytes-labels"
"""The presets' corpus: bytes, targets equal to the inputs (HF's loss shifts them)."""
ATTENTION = ("sdpa", "eager")
"""Attention implementations a preset may ask transformers for (both run on CPU)."""
_CONFIGS = {"gpt2": "GPT2Config", "llama": "LlamaConfig", "qwen2": "Qwen2Config",
            "mistral": "MistralConfig"}
_BYTES = 256


@dataclass(frozen=True)
class HFPreset:
    """Shape of a small model of one family; the options ``build_model("hf-...", **options)``
    and the CLI's ``--seq-len``/``--hf-config`` set."""

    n_layers: int = 4
    """Decoder layers (``n_layer`` / ``num_hidden_layers``)."""

    d_model: int = 64
    """Hidden width (``n_embd`` / ``hidden_size``)."""

    n_heads: int = 4
    """Attention heads; must divide ``d_model``."""

    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (Llama family; None: ``n_heads``)."""

    d_ff: int = 256
    """MLP width (``n_inner`` / ``intermediate_size``)."""

    seq_len: int = 64
    """Context length (``n_positions`` / ``max_position_embeddings``) and tokens per sample of
    the default data. With ``config_file``: tokens per sample only."""

    sublayer: bool = False
    """Split each decoder layer into its attention and MLP halves (AutoPipe's granularity)."""

    tie_word_embeddings: bool = False
    """Share the embedding and LM-head weight; on different stages each holds a copy, kept one
    parameter by summing their gradients (``runtime/execution/ties.py``; schedules that would
    show the copies different weight versions are refused)."""

    attention: str = "sdpa"
    """transformers' attention implementation, one of :data:`ATTENTION`."""

    config_file: str | None = None
    """A transformers ``config.json`` of a supported family, used instead of the fields above
    (except ``seq_len`` and ``sublayer``); its ``vocab_size`` must cover the 256 bytes."""

    pretrained: str | None = None
    """A local folder written by ``save_pretrained`` (``config.json`` and safetensors
    weights): its config instead of the fields above (except ``seq_len`` and ``sublayer``) and
    its weights, each rank reading only its own blocks' (:mod:`pipeweave.hf.pretrained`)."""

    def __post_init__(self) -> None:
        if self.pretrained is not None and self.config_file is not None:
            raise ValueError("give --hf-pretrained DIR or --hf-config FILE, not both (the "
                             "folder has its own config.json)")
        for field in ("n_layers", "d_model", "n_heads", "d_ff", "seq_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"HFPreset.{field}={value!r} is invalid; pass an int >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(f"HFPreset.d_model={self.d_model} is not divisible by n_heads="
                             f"{self.n_heads}; choose n_heads among the divisors of d_model")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.n_heads % self.kv_heads):
            raise ValueError(f"HFPreset.kv_heads={self.kv_heads} must divide n_heads="
                             f"{self.n_heads}; pass one of its divisors or None")
        if self.attention not in ATTENTION:
            raise ValueError(f"HFPreset.attention={self.attention!r}; choose one of {ATTENTION}")


PRESETS: dict[str, tuple[str, HFPreset]] = {
    "hf-gpt2": ("gpt2", HFPreset()),
    "hf-llama": ("llama", HFPreset(kv_heads=2)),
    "hf-qwen2": ("qwen2", HFPreset(kv_heads=2)),
    "hf-mistral": ("mistral", HFPreset(kv_heads=2)),
}
"""Registered name -> (family, default shape)."""


def config_family(path: str | Path, *, flag: str = "--hf-config") -> str:
    """The supported family (``model_type``) of a ``config.json``; ValueError otherwise
    (naming ``flag``, the option that gave it). Reads the JSON only (no transformers)."""
    from ..files import read_json

    file = Path(path)
    data = read_json(file, what=f"{flag} {file}",
                     fix="give the path of a transformers config.json")
    family = data.get("model_type") if isinstance(data, dict) else None
    if family not in SUPPORTED:
        raise ValueError(f"{flag} {file}: model_type {family!r} is not supported; "
                         f"pipeweave.hf adapts {', '.join(sorted(SUPPORTED))} (decoder-only "
                         f"causal LMs)")
    return str(family)


def hf_config(family: str, preset: HFPreset) -> Any:
    """The transformers config a preset describes (or its ``config_file``'s)."""
    if family not in SUPPORTED:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(SUPPORTED)}")
    transformers = require_transformers()
    config_class = getattr(transformers, _CONFIGS[family])
    file = (str(check_pretrained(preset.pretrained)) if preset.pretrained is not None
            else preset.config_file)
    if file is not None:
        flag = "--hf-pretrained" if preset.pretrained is not None else "--hf-config"
        given = preset.pretrained if preset.pretrained is not None else file
        found = config_family(file, flag=flag)
        if found != family:
            raise ValueError(f"{flag} {given} is a {found} model; use --model hf-{found}")
        config = config_class.from_json_file(file)
        if config.vocab_size < _BYTES:
            raise ValueError(f"{flag} {given}: vocab_size={config.vocab_size} < {_BYTES}; the "
                             f"built-in corpus is byte-level and needs vocab_size >= {_BYTES}")
        return config
    shape: dict[str, Any] = {"vocab_size": _BYTES, "tie_word_embeddings": preset.tie_word_embeddings,
                             "bos_token_id": None, "eos_token_id": None}
    if family == "gpt2":
        if preset.kv_heads is not None:
            raise ValueError("GPT-2 has no grouped-query attention; leave kv_heads=None")
        shape.update(n_positions=preset.seq_len, n_embd=preset.d_model, n_layer=preset.n_layers,
                     n_head=preset.n_heads, n_inner=preset.d_ff, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        shape.update(hidden_size=preset.d_model, intermediate_size=preset.d_ff,
                     num_hidden_layers=preset.n_layers, num_attention_heads=preset.n_heads,
                     num_key_value_heads=preset.kv_heads or preset.n_heads,
                     max_position_embeddings=preset.seq_len)
    config = config_class(**shape)
    config._attn_implementation = preset.attention
    return config


def hf_model(family: str, preset: HFPreset) -> nn.Module:
    """The transformers model (random weights from the global torch RNG) of a preset."""
    config = hf_config(family, preset)
    model: nn.Module = getattr(require_transformers(), SUPPORTED[family])(config)
    return model


def _build(family: str, preset: HFPreset) -> tuple[list[nn.Module], list[str], Init | None]:
    """The blocks of the preset's model (built under ``torch.device("meta")`` by
    ``build_model``) and their initialiser, the model's own ``_init_weights``."""
    model = hf_model(family, preset)
    spec = blocks(model, sublayer=preset.sublayer)
    if preset.pretrained is None:
        return list(spec.blocks), list(spec.block_names), spec.init
    return (list(spec.blocks), list(spec.block_names),
            PretrainedInit(model, spec.blocks, spec.block_names, preset.pretrained))


for _name, (_family, _preset) in PRESETS.items():
    register_model(_name, config=_preset, build=partial(_build, _family),
                   loss_fn=CausalLMLoss(), dataset=DATASET, meta=True)


def exported_names(name: str, **overrides: Any) -> tuple[dict[str, str], Any]:
    """For the registered HF model ``name`` (with ``build_model``'s ``overrides``): each
    parameter's global name (``"<block>.<name>"``) -> its name in transformers' state dict,
    and the model's config. A parameter tied to another (GPT-2's LM head) gets the name
    ``save_pretrained`` stores it under. Built on the meta device: nothing is allocated."""
    import dataclasses

    import torch

    if name not in PRESETS:
        raise ValueError(f"unknown HF model {name!r}; choose one of {sorted(PRESETS)}")
    family, preset = PRESETS[name]
    preset = dataclasses.replace(preset, **overrides)
    with torch.device("meta"):
        model = hf_model(family, preset)
    spec = blocks(model, sublayer=preset.sublayer)
    stored = {id(p): key for key, p in model.named_parameters()}  # tied: the first name only
    names = {f"{index}.{local}": stored[id(p)] for index, block in enumerate(spec.blocks)
             for local, p in block.named_parameters(remove_duplicate=False)}
    return names, model.config
