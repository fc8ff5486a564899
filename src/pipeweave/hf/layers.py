"""The blocks a Hugging Face causal LM is cut into, each one tensor in and one tensor out.

HF's ``*Model.forward`` computes, once per forward, what its decoder layers need besides the
hidden state: position ids ``arange(T)``, the causal mask (``masking_utils``; ``None`` when
SDPA can use ``is_causal``) and, for the Llama family, the rotary ``(cos, sin)`` from the
model's own rotary module. Only the hidden state crosses a pipeline boundary, so every block
that runs attention recomputes them from the hidden state's shape (:class:`CausalContext`),
with the same functions, arguments and dtypes as HF's forward: the numbers are the same.

    int64 ids [B, T] -> Embedding -> [B, T, d]
      -> DecoderLayer x L                        (the layer's own forward), or
         (AttentionHalf, MLPHalf) x L            (sublayer split, AutoPipe's granularity)
      -> Head (final norm, LM head) -> logits [B, T, V]

Every block holds the model's own submodules (no copies): training the blocks trains the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["AttentionHalf", "CausalContext", "DecoderLayer", "GPT2Embedding", "Head",
           "MLPHalf", "TokenEmbedding"]

MaskFunction = Callable[..., Any]
"""``transformers.masking_utils.create_causal_mask`` or its sliding-window sibling."""


def _check_ids(ids: Tensor, limit: int | None, what: str) -> None:
    if ids.dim() != 2 or ids.dtype != torch.int64:
        raise ValueError(f"the embedding block expects int64 token ids of shape [batch, seq]; "
                         f"got dtype={ids.dtype} shape={tuple(ids.shape)}")
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"sequence length {ids.shape[1]} exceeds the model's {what}={limit}; "
                         f"feed sequences of at most {limit} tokens (e.g. --seq-len {limit})")


def position_ids(hidden: Tensor) -> Tensor:
    """``[1, T]`` positions ``0..T-1``, as HF's forward makes them without a cache."""
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class GPT2Embedding(nn.Module):
    """GPT-2's token plus learned position embedding, then dropout: ``[B, T]`` -> ``[B, T, d]``."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: Tensor) -> Tensor:
        _check_ids(ids, self.wpe.num_embeddings, "n_positions")
        hidden = self.wte(ids) + self.wpe(position_ids(ids))  # [B, T, d] + [1, T, d]
        out: Tensor = self.drop(hidden)
        return out


class TokenEmbedding(nn.Module):
    """The Llama family's token embedding (positions enter as rotary, inside attention)."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, ids: Tensor) -> Tensor:
        _check_ids(ids, None, "")
        out: Tensor = self.embed_tokens(ids)
        return out


class CausalContext(nn.Module):
    """The keyword arguments an HF decoder layer (or its attention) takes besides the hidden
    state, recomputed from the hidden state as HF's ``*Model.forward`` computes them.

    ``rotary``: the model's rotary module (Llama family; shared by all layers, no parameters),
    None for GPT-2. The mask function is chosen per layer (full or sliding-window attention).
    """

    def __init__(self, config: Any, mask: MaskFunction, rotary: nn.Module | None) -> None:
        super().__init__()
        self.config, self.mask, self.rotary = config, mask, rotary

    def forward(self, hidden: Tensor) -> dict[str, Any]:
        positions = position_ids(hidden)
        inputs: dict[str, Any] = {
            "attention_mask": self.mask(config=self.config, inputs_embeds=hidden,
                                        attention_mask=None, past_key_values=None,
                                        position_ids=positions),
            "position_ids": positions,
        }
        if self.rotary is not None:
            inputs["position_embeddings"] = self.rotary(hidden, positions)  # (cos, sin)
        return inputs


class DecoderLayer(nn.Module):
    """One whole decoder layer, run by its own ``forward``."""

    def __init__(self, layer: nn.Module, context: CausalContext) -> None:
        super().__init__()
        self.layer, self.context = layer, context

    def forward(self, hidden: Tensor) -> Tensor:
        out: Tensor = self.layer(hidden, **self.context(hidden))
        return out


class AttentionHalf(nn.Module):
    """A pre-norm layer's first half: ``h + attention(norm(h))`` (GPT-2's ``ln_1``/``attn``,
    the Llama family's ``input_layernorm``/``self_attn``), wired as the layer's forward."""

    def __init__(self, norm: nn.Module, attention: nn.Module, context: CausalContext) -> None:
        super().__init__()
        self.norm, self.attention, self.context = norm, attention, context

    def forward(self, hidden: Tensor) -> Tensor:
        attended, _ = self.attention(self.norm(hidden), **self.context(hidden))
        out: Tensor = hidden + attended
        return out


class MLPHalf(nn.Module):
    """A pre-norm layer's second half: ``h + mlp(norm(h))`` (GPT-2's ``ln_2``/``mlp``, the
    Llama family's ``post_attention_layernorm``/``mlp``)."""

    def __init__(self, norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm, self.mlp = norm, mlp

    def forward(self, hidden: Tensor) -> Tensor:
        out: Tensor = hidden + self.mlp(self.norm(hidden))
        return out


class Head(nn.Module):
    """The final norm and the LM head: ``[B, T, d]`` -> logits ``[B, T, V]``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, hidden: Tensor) -> Tensor:
        out: Tensor = self.lm_head(self.norm(hidden))
        return out
