"""The link model: an exact fit on synthetic samples, and a real two-process measurement."""

from __future__ import annotations

import math

import pytest

from pipeweave.profiler.link import fit_link, measure_link


def test_fit_recovers_latency_and_bandwidth() -> None:
    samples = [(b, 2e-5 + b / 3e9) for b in (1e3, 1e5, 1e6, 1e7)]
    link = fit_link(samples)
    assert link.bandwidth == pytest.approx(3e9) and link.latency == pytest.approx(2e-5)


def test_fit_rejects_degenerate_samples() -> None:
    with pytest.raises(ValueError, match="two or more message sizes"):
        fit_link([(1e3, 1e-5), (1e3, 2e-5)])
    with pytest.raises(ValueError, match="do not grow with message size"):
        fit_link([(1e3, 1e-3), (1e6, 1e-5)])


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_measure_link_between_two_local_ranks() -> None:
    link = measure_link(sizes=(1 << 10, 1 << 18, 1 << 22), repeats=5)
    # Loopback gloo: below 1 TB/s, a latency >= 0. How fast it is depends on what else runs
    # on the machine (load only slows it), so no lower bound on the speed is asserted here.
    assert 0 < link.bandwidth < 1e12
    assert 0 <= link.latency < math.inf


def test_fit_keeps_the_latency_when_a_large_message_is_noisy() -> None:
    """One 16 MiB exchange 30 % slow (a busy machine) moves an unweighted line's intercept by
    more than the latency itself; weighted for relative error, the small messages keep it."""
    sizes = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
    samples = [(float(b), 1e-4 + b / 2.5e9) for b in sizes]
    samples[-1] = (samples[-1][0], samples[-1][1] * 1.3)
    xs, ys = [b for b, _ in samples], [t for _, t in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert my - slope * mx < 0  # the unweighted fit: a negative latency, clamped to 0 before
    link = fit_link(samples)
    assert link.latency == pytest.approx(1e-4, rel=0.1)
    assert link.bandwidth == pytest.approx(2.5e9, rel=0.15)
