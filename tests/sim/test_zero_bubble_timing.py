"""The simulator on the split backward: zb-h1 and zb-h2 against closed forms.

Costs: ``F`` forward, ``B`` the whole backward, ``W`` its weight-gradient part
(``Costs.weight_grad``) and ``I = B - W`` its input-gradient part. The defaults F=1, B=2 give
the zero-bubble paper's unit costs F = I = W = 1.

**1F1B** runs every backward whole: ``(M+P-1)(F+B)``; P=4, M=8: 11 x 3 = **33**, each stage
idle ``(P-1)(F+I+W) = 9``.

**ZB-H1**, F = I = W = 1, P=4, M=8 (the figure in tests/schedules/test_zero_bubble.py).
Stage ``i`` gets micro-batch ``j`` at ``i + j`` and runs its ``P-i`` first forwards back to
back from ``i``, ending at ``P = 4`` on every stage. Micro-batch 0's input gradient starts on
the last stage at 4 and reaches stage ``i`` at ``4 + (P-1-i)``; so stage ``i`` idles ``i``
units before its first forward and ``P-1-i`` before its first ``I``: ``P-1 = 3`` in all. From
its first ``I`` on no stage waits again (the figure), so every stage ends at
``3 + M(F+I+W) = 3 + 24 =`` **27**, and the bubble fraction is ``3/27 = 1/9``. In general
(Qi et al., §2.1) the idle time per stage is ``(P-1)(F+I-W)`` when ``W <= min(F, I)`` and
``M >= P``.

**ZB-H2**, F = I = W = 1, P=4, M=8. Stage ``i`` runs ``2P-1-2i`` forwards back to back from
``i`` (its predecessor has run more by then), ending at ``2P-1-i``; micro-batch 0's input
gradient starts on the last stage at ``P`` and reaches stage ``i`` at ``P + (P-1-i) =
2P-1-i``: the first ``I`` starts the moment the forwards end, and stage ``i`` never waits
again (the figure): it is busy over ``[i, i + M(F+I+W)]``. The iteration ends with the last
stage: ``(P-1)F + M(F+I+W) = 3 + 24 =`` **27** — the same as ZB-H1 at equal costs. For
``I <= F`` and ``M >= 2P-1`` this is ``M(F+I+W) + (P-1)F`` exactly, which beats ZB-H1 when
``W < I``: F=2, I=1, W=0.5 (B=1.5) give ZB-H2 ``8 x 3.5 + 3 x 2 = 34`` and ZB-H1
``28 + 3 x 2.5 = 35.5``. At equal costs, over ``K``
iterations, stage ``i`` starts iteration ``k+1`` when its own update ``k+1`` is done, at
``i + k M(F+I+W)`` (stage 0 finishes first, and the stage below it has the activation ready
exactly then): the parallelograms tile and K iterations take ``K M(F+I+W) + (P-1)F``; K=3:
``72 + 3 = 75``, iteration time 25 against ZB-H1's 27.

**Peak activations** (an activation is held from its F to its W): 1F1B ``P-s`` on stage
``s``, so [4, 3, 2, 1]; ZB-H1 ``P`` on every stage, [4, 4, 4, 4]; ZB-H2 ``2P-1``,
[7, 7, 7, 7].
"""

from __future__ import annotations

import itertools

import pytest

from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate


def run(name: str, p: int = 4, m: int = 8, k: int = 1, **costs: float):  # type: ignore[no-untyped-def]
    return simulate(build_schedule(name, stages=p, microbatches=m, iterations=k), Costs(**costs))


def test_p4_m8_unit_costs() -> None:
    one_f_one_b, h1, h2 = (run(name) for name in ("1f1b", "zb-h1", "zb-h2"))
    assert (one_f_one_b.makespan, h1.makespan, h2.makespan) == (33.0, 27.0, 27.0)
    assert h1.bubble_fraction == pytest.approx(1 / 9)
    assert one_f_one_b.bubble_fraction == pytest.approx(3 / 11)
    assert one_f_one_b.peak_activations == [4, 3, 2, 1]
    assert h1.peak_activations == [4, 4, 4, 4]
    assert h2.peak_activations == [7, 7, 7, 7]
    # every rank idles P-1 = 3 units under ZB-H1, against (P-1)(F+I+W) = 9 under 1F1B
    assert [h1.makespan - busy for busy in h1.busy] == [3.0] * 4
    assert [one_f_one_b.makespan - busy for busy in one_f_one_b.busy] == [9.0] * 4


def test_p4_m8_explicit_weight_gradient_and_several_iterations() -> None:
    """``--backward 2 --weight-grad 1`` is the default; over 3 iterations ZB-H2's parallelograms
    tile (75, iteration time 25) while ZB-H1 and 1F1B repeat theirs (81, 99)."""
    assert run("zb-h1", backward=2, weight_grad=1).makespan == 27.0
    assert [run(name, k=3).makespan for name in ("1f1b", "zb-h1", "zb-h2")] == [99.0, 81.0, 75.0]
    assert run("zb-h2", k=3).iteration_time == 25.0


COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.5, 1.0, 0.5),
         (2.0, 2.0, 1.0), (1.0, 0.5, 0.5)]
"""(F, I, W) with W <= min(F, I), where the paper's ZB-H1 bubble holds."""


@pytest.mark.parametrize(("f", "i", "w"), COSTS)
def test_zb_h1_idles_p_minus_1_times_f_plus_i_minus_w(f: float, i: float, w: float) -> None:
    """Makespan ``M(F+I+W) + (P-1)(F+I-W)`` for ``M >= P`` (Qi et al., §2.1); e.g. F=1, B=3,
    W=1 (I=2), P=4, M=8: 32 + 3 x 2 = 38."""
    for p, m in itertools.product(range(1, 6), range(1, 13)):
        if m < p:
            continue
        result = run("zb-h1", p, m, forward=f, backward=i + w, weight_grad=w)
        assert result.makespan == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w)), (p, m)
    assert run("zb-h1", forward=1, backward=3, weight_grad=1).makespan == 38.0


@pytest.mark.parametrize(("f", "i", "w"), [c for c in COSTS if c[1] <= c[0]] + [(1.0, 1.0, 2.0)])
def test_zb_h2_is_a_parallelogram(f: float, i: float, w: float) -> None:
    """Makespan ``M(F+I+W) + (P-1)F`` for ``I <= F`` and ``M >= 2P-1``: the last stage is never
    idle after its first forward. (Only at equal costs are the other stages too, so that
    iterations tile: with F=2, I=W=1 stage 0 ends at 35, not M(F+I+W) = 32.)"""
    for p, m in itertools.product(range(1, 6), range(1, 13)):
        if m < 2 * p - 1:
            continue
        result = run("zb-h2", p, m, forward=f, backward=i + w, weight_grad=w)
        assert result.makespan == pytest.approx(m * (f + i + w) + (p - 1) * f), (p, m)
        assert result.makespan - result.busy[-1] == pytest.approx((p - 1) * f)


def test_zb_h2_beats_zb_h1_when_the_weight_gradient_is_the_smaller_part() -> None:
    """F=2, I=1, W=0.5 (B=1.5), P=4, M=8: ZB-H2 8 x 3.5 + 3 x 2 = 34, ZB-H1 28 + 3 x 2.5 = 35.5."""
    costs = {"forward": 2.0, "backward": 1.5, "weight_grad": 0.5}
    assert (run("zb-h2", **costs).makespan, run("zb-h1", **costs).makespan) == (34.0, 35.5)


def test_a_measured_input_grad_prices_the_split() -> None:
    """With I + W dearer than B (two passes), ZB-H1 pays for the split where it splits: at
    P = 2, M = 4, F = 1, B = 2 and I = W = 1.25, stage 0's I+W pairs are merged into B by
    lowering (cost 2), and the last stage, which splits, bounds the iteration: it starts one F
    late and then runs M (F + I + W) = 4 x 3.5, so 1 + 14 = 15 (13 when the split is free)."""
    from pipeweave.ir import lower
    from pipeweave.schedules import build_schedule
    from pipeweave.sim import Costs, simulate

    schedule = lower(build_schedule("zb-h1", stages=2, microbatches=4))
    even = simulate(schedule, Costs(forward=1, backward=2)).iteration_time
    dear = simulate(schedule, Costs(forward=1, backward=2, weight_grad=1.25,
                                    input_grad=1.25)).iteration_time
    assert even == 13  # M(F+I+W) + (P-1)(F+I-W) = 12 + 1
    assert dear == 15
