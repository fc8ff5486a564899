"""``pipeweave.collector.paused_collection`` turns the collector off for its body only, nested
or not, and after an error too."""

from __future__ import annotations

import gc

import pytest

from pipeweave.collector import paused_collection


def test_paused_then_restored() -> None:
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            with paused_collection():
                assert not gc.isenabled()
                with paused_collection():
                    assert not gc.isenabled()
                assert not gc.isenabled()
            assert gc.isenabled() is enabled
        gc.enable()
        with pytest.raises(RuntimeError), paused_collection():
            raise RuntimeError("boom")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
