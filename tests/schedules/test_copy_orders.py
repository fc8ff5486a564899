"""The list-scheduled orders laid out as columns (schedules/copy_orders.py,
schedules/steady_orders.py) are their order functions' passes, pass for pass, on many shapes;
the steady state is really copied (not only stepped) on some of them, and copying one step
further than allowed would be caught."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from pipeweave.schedules import steady_orders
from pipeweave.schedules.common import Pass
from pipeweave.schedules.copy_orders import Rows, copy_rows, passes_rows
from pipeweave.schedules.dualpipev import dualpipev_order
from pipeweave.schedules.interleaved_zb import interleaved_zb_order
from pipeweave.schedules.v_blocks import _v_half_order, _v_min_order
from pipeweave.schedules.zbv import zbv_order

ORDERS: dict[str, tuple[object, int]] = {
    "zbv": (zbv_order, 2), "v-half": (_v_half_order, 2), "v-min": (_v_min_order, 2),
    "dualpipev": (dualpipev_order, 2), "interleaved-zb": (interleaved_zb_order, 2),
    "interleaved-zb-3": (interleaved_zb_order, 3), "interleaved-zb-1": (interleaved_zb_order, 1)}
SHAPES = list(itertools.product((1, 2, 3, 4, 5, 8, 16), (1, 2, 3, 4, 7, 8, 16, 17, 24, 48, 96)))


def _reference(order: object, P: int, M: int, chunks: int) -> list[Rows]:
    if order is interleaved_zb_order:
        passes: Sequence[Sequence[Pass]] = interleaved_zb_order(P, M, chunks)
    else:
        passes = order(P, M)  # type: ignore[operator]
    return [passes_rows(p) for p in passes]


def _same(got: Sequence[Rows], want: Sequence[Rows]) -> bool:
    return len(got) == len(want) and all(
        all(np.array_equal(a, b) for a, b in zip(g, w)) for g, w in zip(got, want))


def _covered(name: str, P: int, M: int) -> bool:
    if name == "dualpipev":
        return M >= 2 * P
    return not name.startswith("interleaved-zb") or M % P == 0


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_columns_are_the_order_functions_passes(name: str) -> None:
    order, chunks = ORDERS[name]
    compared = 0
    for P, M in SHAPES:
        if not _covered(name, P, M):
            continue
        got = copy_rows(order, P, M, chunks)
        assert _same(got, _reference(order, P, M, chunks)), (name, P, M)
        compared += 1
    assert compared >= 25


def _counting(monkeypatch: pytest.MonkeyPatch, extra: int) -> list[int]:
    """Record every copy count ``_run`` is allowed (``extra`` added to each: a rule copied
    further than it holds)."""
    allowed: list[int] = []
    run = steady_orders._run

    def counted(counts: np.ndarray, total: int, step: Callable[..., np.ndarray],
                copies: Callable[..., int], modulus: int = 1) -> np.ndarray:
        def more(before: np.ndarray, now: np.ndarray, shift: int) -> int:
            times = copies(before, now, shift)
            allowed.append(times)
            return times + extra if times > 0 else 0
        return run(counts, total, step, more, modulus)

    monkeypatch.setattr(steady_orders, "_run", counted)
    return allowed


@pytest.mark.parametrize("name", ["zbv", "interleaved-zb", "interleaved-zb-3"])
def test_the_steady_state_is_copied(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    order, chunks = ORDERS[name]
    rows = steady_orders.zbv_rows if order is zbv_order else (
        lambda P, M: steady_orders.interleaved_zb_rows(P, M, chunks))
    allowed = _counting(monkeypatch, 0)
    got = rows(8, 96)
    assert max(allowed) >= 2, allowed
    assert _same(got, _reference(order, 8, 96, chunks))


@pytest.mark.parametrize("name", ["zbv", "interleaved-zb"])
def test_one_copy_too_many_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies allowed are exactly as many as hold: one more changes the order."""
    order, chunks = ORDERS[name]
    rows = steady_orders.zbv_rows if order is zbv_order else (
        lambda P, M: steady_orders.interleaved_zb_rows(P, M, chunks))
    _counting(monkeypatch, 1)
    wrong = 0
    for P, M in [(2, 16), (4, 48), (8, 96), (3, 24)]:
        try:
            wrong += not _same(rows(P, M), _reference(order, P, M, chunks))
        except (AssertionError, IndexError):
            wrong += 1
    assert wrong >= 3
