"""Reference models for pipeline training: GPT-style decoder, digits MLP and CNN.

A model reaches the pipeline as a :class:`ModelSpec` — an ordered tuple of one-tensor-in,
one-tensor-out blocks plus a batch-mean loss.  ``build_model(name)`` builds the presets
(``available_models()``); ``ModelSpec.from_blocks`` wraps a user's own blocks.
"""

from pipeweave.models.cnn import CNNConfig, MLPConfig
from pipeweave.models.gpt import GPTConfig
from pipeweave.models.registry import (LossFn, ModelSpec, available_models, build_model,
                                      default_seq_len, register_model)

__all__ = [
    "CNNConfig",
    "GPTConfig",
    "LossFn",
    "MLPConfig",
    "ModelSpec",
    "available_models",
    "build_model",
    "default_seq_len",
    "register_model",
]
