"""The names ``--model`` accepts, without torch: the built-in models, those a package above
``pipeweave.models`` registers on first use (``hf-*``), and any a program registered with
:func:`pipeweave.models.register_model`. The registry builds the models; this module only
names them, so that a command's ``--help`` and planning from a saved profile
(``pipeweave auto --profile FILE``) list and check them without importing torch."""

from __future__ import annotations

__all__ = ["BUILT_IN", "PROVIDED", "add_model_name", "model_names"]

BUILT_IN = ("gpt-tiny", "gpt-small", "mlp", "cnn")
"""The models :mod:`pipeweave.models.registry` builds itself (it checks it builds these)."""

PROVIDED: dict[str, str] = {
    name: "pipeweave.hf.presets" for name in ("hf-gpt2", "hf-llama", "hf-qwen2", "hf-mistral")
}
"""Names built by a package above ``pipeweave.models``, and the module that registers them.

``pipeweave.hf`` adapts Hugging Face models and imports :class:`~pipeweave.models.ModelSpec`,
so the models layer cannot import it; the registering module is imported on the first use of
one of its names instead (which also keeps ``transformers`` out of ``import
pipeweave.models``)."""

_registered: set[str] = set()


def add_model_name(name: str) -> None:
    """Record a name :func:`pipeweave.models.register_model` added."""
    _registered.add(name)


def model_names() -> list[str]:
    """Every name ``build_model`` accepts, sorted."""
    return sorted({*BUILT_IN, *PROVIDED, *_registered})
