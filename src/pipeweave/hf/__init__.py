"""Hugging Face ``transformers`` causal LMs as pipeline models, without tracing.

``blocks(model)`` turns a user's own ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
``Qwen2ForCausalLM`` or ``MistralForCausalLM`` into a :class:`~pipeweave.models.ModelSpec`
whose blocks wrap the model's modules (its weights as they are); ``build_model("hf-gpt2")``
(and ``hf-llama``, ``hf-qwen2``, ``hf-mistral``) builds a small random one
(:mod:`pipeweave.hf.presets`). ``transformers`` is an optional extra (``pip install -e
'.[hf]'``), imported only when a model is adapted or built.

    import pipeweave.hf
    spec = pipeweave.hf.blocks(model, sublayer=True)    # embed, layer0.attn, ..., head
"""

from .adapter import SUPPORTED, blocks, family_of
from .loss import CausalLMLoss

__all__ = ["SUPPORTED", "CausalLMLoss", "blocks", "family_of"]
