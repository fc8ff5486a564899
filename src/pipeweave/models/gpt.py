"""A GPT-style byte-level decoder, cut into pipeline blocks.

Every block maps one tensor to one tensor, so any contiguous range of blocks is a valid
pipeline stage::

    tokens [B, T] int64
      -> Embedding                  -> [B, T, d]
      -> (AttentionBlock, FFNBlock) x n_layers   (sublayer=True, AutoPipe granularity)
         or TransformerLayer x n_layers          (sublayer=False)
      -> Head                       -> logits [B, T, V]

The architecture follows nanoGPT (pre-LayerNorm residual blocks, GELU MLP, learned position
embeddings, GPT-2 initialisation).  Unlike nanoGPT the token embedding and the output projection
are *not* tied, so that this reference model's stages share nothing (the runtime can keep a tie
across stages, ``runtime/execution/ties.py``; the Hugging Face models use it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "GPT_PRESETS",
    "AttentionBlock",
    "Embedding",
    "FFNBlock",
    "GPTConfig",
    "Head",
    "TransformerLayer",
    "gpt_blocks",
    "gpt_init",
    "gpt_loss",
]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-style decoder; validated on construction."""

    vocab_size: int = 256
    """Number of distinct tokens; 256 for the byte-level corpus."""

    seq_len: int = 64
    """Longest sequence the position embedding covers (the context length)."""

    d_model: int = 64
    """Width of the residual stream."""

    n_heads: int = 4
    """Attention heads per layer; must divide ``d_model``."""

    n_layers: int = 4
    """Number of transformer layers."""

    d_ff: int = 256
    """Hidden width of each feed-forward MLP (usually ``4 * d_model``)."""

    dropout: float = 0.0
    """Dropout probability on embeddings, attention and residual branches (0 disables it)."""

    sublayer: bool = True
    """Split each layer into an attention block and an FFN block (AutoPipe's sub-layer
    granularity, ``2 * n_layers + 2`` blocks) instead of one block per layer
    (``n_layers + 2`` blocks)."""

    def __post_init__(self) -> None:
        for field in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers", "d_ff"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{field}={value!r} is invalid; pass an int >= 1")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of d_model"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout={self.dropout!r} is invalid; pass 0 <= p < 1")
        if not isinstance(self.sublayer, bool):
            raise TypeError(f"GPTConfig.sublayer={self.sublayer!r} is invalid; pass True or False")

    @property
    def num_blocks(self) -> int:
        """Number of pipeline blocks this configuration produces."""
        per_layer = 2 if self.sublayer else 1
        return per_layer * self.n_layers + 2


GPT_PRESETS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(),
    "gpt-small": GPTConfig(d_model=128, n_layers=8, n_heads=4, d_ff=512, seq_len=128),
}
"""Named configurations served by :func:`pipeweave.models.build_model`."""


class Embedding(nn.Module):
    """Token plus learned position embedding: int64 ``[B, T]`` -> float ``[B, T, d]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.seq_len = config.seq_len
        self.vocab_size = config.vocab_size
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2 or idx.dtype != torch.int64:
            raise ValueError(
                f"Embedding expects int64 token ids of shape [batch, seq]; got dtype={idx.dtype} "
                f"shape={tuple(idx.shape)}"
            )
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(
                f"sequence length {t} exceeds GPTConfig.seq_len={self.seq_len}; "
                f"build the model with seq_len>={t} or feed shorter sequences"
            )
        positions = torch.arange(t, device=idx.device)
        x: Tensor = self.tok(idx) + self.pos(positions)  # [B, T, d] + [T, d]
        out: Tensor = self.drop(x)
        return out


class AttentionBlock(nn.Module):
    """Pre-norm causal self-attention with its residual: ``x + attn(LayerNorm(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.ln = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln(x))  # [B, T, 3w]: w = d, or d / tp for this rank's heads
        w = qkv.shape[2] // 3  # (tensor parallel: runtime/execution/tensor_parallel.py)
        h = self.n_heads * w // d
        q, k, v = qkv.split(w, dim=2)  # 3 x [B, T, w]
        q = q.view(b, t, h, w // h).transpose(1, 2)  # [B, h, T, d/heads]
        k = k.view(b, t, h, w // h).transpose(1, 2)
        v = v.view(b, t, h, w // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # [B, h, T, d/heads]
        y = y.transpose(1, 2).reshape(b, t, w)
        out: Tensor = x + self.drop(self.proj(y))
        return out


class FFNBlock(nn.Module):
    """Pre-norm GELU MLP with its residual: ``x + MLP(LayerNorm(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(config.d_model)
        self.fc = nn.Linear(config.d_model, config.d_ff)
        self.act = nn.GELU()
        self.proj = nn.Linear(config.d_ff, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.drop(self.proj(self.act(self.fc(self.ln(x)))))
        return out


class TransformerLayer(nn.Module):
    """One whole transformer layer (attention then FFN) as a single block."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attn = AttentionBlock(config)
        self.ffn = FFNBlock(config)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.ffn(self.attn(x))
        return out


class Head(nn.Module):
    """Final LayerNorm and projection to the vocabulary: ``[B, T, d]`` -> ``[B, T, V]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(config.d_model)
        self.out = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.out(self.ln(x))
        return out


def _init_weights(module: nn.Module, n_layers: int) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual projections scaled by
    ``1/sqrt(2 * n_layers)`` (Radford et al. 2019, section 2.3)."""
    for name, sub in module.named_modules():
        _init_module(sub, name, n_layers)


def _init_module(module: nn.Module, name: str, n_layers: int) -> None:
    """:func:`_init_weights` of one module (its own tensors); ``name``: its path (in its block,
    or with the block's name first). LayerNorms keep torch's ones and zeros."""
    if isinstance(module, nn.Linear):
        std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("proj") else 0.02
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, nn.LayerNorm):
        module.reset_parameters()


def gpt_blocks(config: GPTConfig) -> tuple[list[nn.Module], list[str]]:
    """Build the decoder's blocks and their names (``embed``, ``layer0.attn``, ..., ``head``).

    Initialisation draws from the global torch RNG; seed it (or use
    :func:`pipeweave.models.build_model`, which does) for reproducible weights.
    """
    blocks: list[nn.Module] = [Embedding(config)]
    names = ["embed"]
    for i in range(config.n_layers):
        if config.sublayer:
            blocks += [AttentionBlock(config), FFNBlock(config)]
            names += [f"layer{i}.attn", f"layer{i}.ffn"]
        else:
            blocks.append(TransformerLayer(config))
            names.append(f"layer{i}")
    blocks.append(Head(config))
    names.append("head")
    for block in blocks:
        _init_weights(block, config.n_layers)
    return blocks, names


def gpt_init(config: GPTConfig) -> Callable[[nn.Module, str], None]:
    """The initialiser of the modules of ``gpt_blocks(config)``'s blocks made real from the
    meta device (:mod:`pipeweave.models.materialize`): GPT-2's, as :func:`_init_weights`."""
    return partial(_init_module, n_layers=config.n_layers)


def gpt_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean token cross-entropy of logits ``[B, T, V]`` against targets ``[B, T]``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
