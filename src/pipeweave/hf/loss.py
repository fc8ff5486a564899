"""The causal-LM loss of a Hugging Face model, as a pipeweave ``loss_fn(logits, labels)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

__all__ = ["CausalLMLoss"]


class CausalLMLoss:
    """``loss_fn(logits, labels)``: the model's own ``loss_function`` (``ForCausalLMLoss``).

    Hugging Face's shift: labels are the input ids; position ``t`` predicts token ``t + 1``
    (the last position has no target), labels ``-100`` are ignored, and the mean runs over
    the remaining tokens. HF computes it in float32 whatever the logits' dtype (float64
    logits included); calling its own function keeps every such detail.

    pipeweave averages micro-batch losses weighted by micro-batch size, which equals HF's
    full-batch token mean when every sample has the same number of counted tokens (no
    ``-100`` labels, as with the built-in corpus); with padding, micro-batches with fewer
    counted tokens weigh each of them more.

    ``function``: a model's ``loss_function``; None: transformers' default causal-LM loss
    (``LOSS_MAPPING["ForCausalLM"]``), looked up on the first call.
    """

    def __init__(self, function: Callable[..., Tensor] | None = None) -> None:
        self.function = function

    def __call__(self, logits: Tensor, labels: Tensor) -> Tensor:
        function = self.function
        if function is None:
            from transformers.loss.loss_utils import LOSS_MAPPING

            mapping: Any = LOSS_MAPPING
            function = self.function = mapping["ForCausalLM"]
        # HF's forward passes config.vocab_size: the logits' last dimension.
        loss: Tensor = function(logits, labels, vocab_size=logits.shape[-1])
        return loss

    def __repr__(self) -> str:
        name: Any = getattr(self.function, "__name__", "ForCausalLMLoss")
        return f"CausalLMLoss({name})"
