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

**Padding mask** (``padding=True``). The input is ``int64 [B, 2, T]``: the token ids and HF's
``attention_mask`` (1 for a token, 0 for padding). The mask rides with the hidden state as
one extra feature, ``[B, T, d + 1]`` (0.0 or 1.0, exact in any float dtype), so it crosses
every stage boundary in the one tensor a block passes on; each attention block hands it to
the mask function as HF's forward does (``attention_mask=``), the head drops it. Its gradient
is zero and goes back with the hidden state's::

    int64 [B, 2, T] -> embed -> [B, T, d | mask] -> ... -> head -> logits [B, T, V]
"""

from __future__ import annotations

import inspect

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["AttentionHalf", "CausalContext", "DecoderLayer", "GPT2Embedding", "Head",
           "MLPHalf", "TokenEmbedding", "join_padding", "split_padding"]

MaskFunction = Callable[..., Any]
"""``transformers.masking_utils.create_causal_mask`` or its sliding-window sibling."""


def _check_ids(ids: Tensor, limit: int | None, what: str) -> None:
    if ids.dim() != 2 or ids.dtype != torch.int64:
        raise ValueError(f"the embedding block expects int64 token ids of shape [batch, seq]; "
                         f"got dtype={ids.dtype} shape={tuple(ids.shape)}")
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"sequence length {ids.shape[1]} exceeds the model's {what}={limit}; "
                         f"feed sequences of at most {limit} tokens (e.g. --seq-len {limit})")


def split_padding(carried: Tensor) -> tuple[Tensor, Tensor]:
    """``[B, T, d + 1]`` -> the hidden state ``[B, T, d]`` and HF's int64 ``attention_mask``
    ``[B, T]`` (module docstring)."""
    return carried[..., :-1], carried[..., -1].round().to(torch.int64)


def join_padding(hidden: Tensor, mask: Tensor) -> Tensor:
    """The hidden state with the padding mask as its last feature."""
    return torch.cat([hidden, mask.to(hidden.dtype).unsqueeze(-1)], dim=-1)


def _check_padded(ids: Tensor) -> tuple[Tensor, Tensor]:
    """``[B, 2, T]`` -> ids and attention mask (ValueError naming the fix otherwise)."""
    if ids.dim() != 3 or ids.shape[1] != 2 or ids.dtype != torch.int64:
        raise ValueError(f"with padding=True the embedding block expects int64 [batch, 2, seq]: "
                         f"token ids and attention_mask stacked on dim 1 (torch.stack([ids, "
                         f"mask], 1)); got dtype={ids.dtype} shape={tuple(ids.shape)}")
    return ids[:, 0], ids[:, 1]


def position_ids(hidden: Tensor) -> Tensor:
    """``[1, T]`` positions ``0..T-1``, as HF's forward makes them without a cache."""
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class GPT2Embedding(nn.Module):
    """GPT-2's token plus learned position embedding, then dropout: ``[B, T]`` -> ``[B, T, d]``."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module,
                 padding: bool = False) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop, self.padding = wte, wpe, drop, padding

    def forward(self, ids: Tensor) -> Tensor:
        mask = None
        if self.padding:
            ids, mask = _check_padded(ids)
        _check_ids(ids, self.wpe.num_embeddings, "n_positions")
        hidden = self.wte(ids) + self.wpe(position_ids(ids))  # [B, T, d] + [1, T, d]
        out: Tensor = self.drop(hidden)
        return out if mask is None else join_padding(out, mask)


class TokenEmbedding(nn.Module):
    """The Llama family's token embedding (positions enter as rotary, inside attention)."""

    def __init__(self, embed_tokens: nn.Embedding, padding: bool = False) -> None:
        super().__init__()
        self.embed_tokens, self.padding = embed_tokens, padding

    def forward(self, ids: Tensor) -> Tensor:
        mask = None
        if self.padding:
            ids, mask = _check_padded(ids)
        _check_ids(ids, None, "")
        out: Tensor = self.embed_tokens(ids)
        return out if mask is None else join_padding(out, mask)


class CausalContext(nn.Module):
    """The keyword arguments an HF decoder layer (or its attention) takes besides the hidden
    state, recomputed from the hidden state as HF's ``*Model.forward`` computes them.

    ``rotary``: the model's rotary module (Llama family; shared by all layers, no parameters),
    None for GPT-2. The mask function is chosen per layer (full or sliding-window attention).
    """

    def __init__(self, config: Any, mask: MaskFunction, rotary: nn.Module | None) -> None:
        super().__init__()
        self.config, self.mask, self.rotary = config, mask, rotary
        self._last: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._no_cache = _no_cache_argument(mask)

    def forward(self, hidden: Tensor, padding: Tensor | None = None) -> dict[str, Any]:
        """``padding``: HF's 2-d ``attention_mask`` (None: no padding).

        Without padding the result depends only on the hidden state's batch, length, dtype
        and device (and the rotary module's frequencies): the layers of a stage, which share
        this context, compute it once per micro-batch shape instead of once each (HF's own
        forward computes it once per forward). Nothing in it needs a gradient."""
        if padding is not None:
            return self._compute(hidden, padding)
        frequencies = getattr(self.rotary, "inv_freq", None)
        key = (tuple(hidden.shape[:2]), hidden.dtype, hidden.device,
               None if frequencies is None else (frequencies.data_ptr(), frequencies._version))
        if self._last is None or self._last[0] != key:
            with torch.no_grad():
                self._last = (key, self._compute(hidden, None))
        return dict(self._last[1])

    def _compute(self, hidden: Tensor, padding: Tensor | None) -> dict[str, Any]:
        positions = position_ids(hidden)
        inputs: dict[str, Any] = {
            "attention_mask": self.mask(config=self.config, inputs_embeds=hidden,
                                        attention_mask=padding, position_ids=positions,
                                        **self._no_cache),
            "position_ids": positions,
        }
        if self.rotary is not None:
            inputs["position_embeddings"] = self.rotary(hidden, positions)  # (cos, sin)
        return inputs


def _no_cache_argument(mask: MaskFunction) -> dict[str, None]:
    """"No KV cache" as the installed transformers spells it: ``cache=None`` (from 5.2x on;
    ``past_key_values`` is deprecated there) or ``past_key_values=None`` (5.17, the GPU
    machine's)."""
    try:
        parameters = inspect.signature(mask).parameters
    except (TypeError, ValueError):
        return {"past_key_values": None}
    return {"cache": None} if "cache" in parameters else {"past_key_values": None}


class DecoderLayer(nn.Module):
    """One whole decoder layer, run by its own ``forward``."""

    def __init__(self, layer: nn.Module, context: CausalContext, padding: bool = False) -> None:
        super().__init__()
        self.layer, self.context, self.padding = layer, context, padding

    def forward(self, hidden: Tensor) -> Tensor:
        if not self.padding:
            out: Tensor = self.layer(hidden, **self.context(hidden))
            return out
        hidden, mask = split_padding(hidden)
        return join_padding(self.layer(hidden, **self.context(hidden, mask)), mask)


class AttentionHalf(nn.Module):
    """A pre-norm layer's first half: ``h + attention(norm(h))`` (GPT-2's ``ln_1``/``attn``,
    the Llama family's ``input_layernorm``/``self_attn``), wired as the layer's forward."""

    def __init__(self, norm: nn.Module, attention: nn.Module, context: CausalContext,
                 padding: bool = False) -> None:
        super().__init__()
        self.norm, self.attention, self.context = norm, attention, context
        self.padding = padding

    def forward(self, hidden: Tensor) -> Tensor:
        if not self.padding:
            attended, _ = self.attention(self.norm(hidden), **self.context(hidden))
            out: Tensor = hidden + attended
            return out
        hidden, mask = split_padding(hidden)
        attended, _ = self.attention(self.norm(hidden), **self.context(hidden, mask))
        return join_padding(hidden + attended, mask)


class MLPHalf(nn.Module):
    """A pre-norm layer's second half: ``h + mlp(norm(h))`` (GPT-2's ``ln_2``/``mlp``, the
    Llama family's ``post_attention_layernorm``/``mlp``)."""

    def __init__(self, norm: nn.Module, mlp: nn.Module, padding: bool = False) -> None:
        super().__init__()
        self.norm, self.mlp, self.padding = norm, mlp, padding

    def forward(self, hidden: Tensor) -> Tensor:
        if not self.padding:
            out: Tensor = hidden + self.mlp(self.norm(hidden))
            return out
        hidden, mask = split_padding(hidden)
        return join_padding(hidden + self.mlp(self.norm(hidden)), mask)


class Head(nn.Module):
    """The final norm and the LM head: ``[B, T, d]`` -> logits ``[B, T, V]``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module, padding: bool = False) -> None:
        super().__init__()
        self.norm, self.lm_head, self.padding = norm, lm_head, padding

    def forward(self, hidden: Tensor) -> Tensor:
        if self.padding:
            hidden, _ = split_padding(hidden)
        out: Tensor = self.lm_head(self.norm(hidden))
        return out
