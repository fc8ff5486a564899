"""Tests marked ``cuda`` need a CUDA device: collected everywhere, skipped where torch sees
none (docs/gpu.md). ``pytest -m cuda`` selects just them on a GPU machine."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)
