"""``pipeweave auto --tp``: which tensor-parallel sizes the search may try.

``--tp`` takes ``1`` (the default without ``--memory-limit``), ``auto`` (the default under
one: every size dividing ``--ranks`` that the runtime can split the model at) or sizes
``1,2,...``. A size is offered only for a model the runtime itself accepts
(``runtime.execution.tensor_parallel.check_parallelizable``: the built-in GPT or the Llama
family, the size dividing the heads, key-value heads and MLP width, no dropout); without
``--model`` (a profile only) ``auto`` means 1 and given sizes are trusted. The search then
also needs the topology's fastest level to hold the size (auto/tensor_parallel.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["auto_tp_sizes"]


def auto_tp_sizes(text: str | None, *, model: str | None, overrides: dict[str, Any],
                  ranks: int, limited: bool) -> tuple[int, ...] | None:
    """The sizes of ``--tp text`` (module docstring); ``None``: 1 only."""
    text = text if text is not None else ("auto" if limited else "1")
    if text == "auto":
        if model is None:
            return None
        sizes = [t for t in range(2, ranks + 1) if ranks % t == 0]
        return (1, *(t for t in sizes if _refusal(model, overrides, t) is None))
    try:
        sizes = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ValueError(f"--tp {text!r}: give auto or sizes separated by commas, e.g. "
                         f"--tp 1,2") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--tp {text!r}: sizes must be >= 1, e.g. --tp 1,2")
    for size in sizes:
        refused = _refusal(model, overrides, size) if model is not None else None
        if refused is not None:
            raise ValueError(f"--tp {text!r}: {refused}")
    return None if sizes == [1] else tuple(sizes)


def _refusal(model: str, overrides: dict[str, Any], tp: int) -> str | None:
    """The runtime's own refusal of splitting ``model`` over ``tp`` processes, if any."""
    if tp == 1:
        return None
    from ..models import build_model
    from ..runtime.execution.tensor_parallel import check_parallelizable

    try:
        check_parallelizable(build_model(model, **overrides).blocks, tp)
    except ValueError as error:
        return str(error)
    return None
