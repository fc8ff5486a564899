"""Equations 1-8 of avgpipe.txt §5.2: closed forms and the paper's own illustrations."""

from __future__ import annotations

import pytest

from pipeweave.avgpipe.equations import (eq1_time, eq2_compute, eq3_comm, eq4_comm, eq5_bubble,
                                         eq6_upstream, eq7_downstream, eq8_memory, overflow)


def test_eq1_and_eq5_are_sums() -> None:
    assert eq1_time(3.0, 0.5, 1.5) == 5.0
    assert eq5_bubble(1.0, 2.5) == 3.5


def test_eq2_unsaturated_scales_time_by_micro_batch_count() -> None:
    # phi = 40 % busy for 10 s, idle 5 s: twice the micro-batches (half the size) halve phi,
    # never reach 100 %, so the same volume takes (m*/m) = 2x the time (§5.2.2, first case)
    phi = [(0.4, 10.0), (0.0, 5.0)]
    assert eq2_compute(10.0, phi, 4, 1, 8, 1) == pytest.approx(20.0)


def test_eq2_overflow_is_the_shaded_area_of_figure_8() -> None:
    # half the micro-batches (twice the size): phi* = 2 x 0.8 = 1.6 > 1 for the 10 busy s,
    # extra (1.6 - 1) x 10 = 6 s, so T* = (1/2)(10 + 6) = 8 s: the volume 0.8 x 10 at 100 %
    phi = [(0.8, 10.0), (0.0, 2.0)]
    assert overflow(phi, 2.0) == pytest.approx(6.0)
    assert eq2_compute(10.0, phi, 8, 1, 4, 1) == pytest.approx(8.0)


def test_eq2_pipelines_share_the_gpu() -> None:
    # n* = 2n at 40 %: phi* = 80 %, each batch takes half the time (concurrency)
    phi = [(0.4, 10.0)]
    assert eq2_compute(10.0, phi, 4, 1, 4, 2) == pytest.approx(5.0)
    # at 100 % busy share the GPU is saturated: a batch takes as long as before
    assert eq2_compute(10.0, [(1.0, 10.0)], 4, 1, 4, 3) == pytest.approx(10.0)


def test_eq3_first_micro_batch_blocks_the_rest_hidden_or_not() -> None:
    # 𝕋 = 4 over m* = 4 micro-batches; computation 10 hides everything after the first
    assert eq3_comm(4.0, 10.0, 4) == pytest.approx(1.0)
    # computation 2 < 𝕋 = 4: the other 3 micro-batches block by (4 - 2)/4 each
    assert eq3_comm(4.0, 2.0, 4) == pytest.approx(1.0 + 3 * 0.5)


def test_eq4_scales_communication_with_pipelines() -> None:
    # (𝕋)* = n*/n 𝕋 = 8; first micro-batch 8/4, then 3/4 x max(8 - 5, 0)
    assert eq4_comm(4.0, 5.0, 1, 2, 4) == pytest.approx(2.0 + 0.75 * 3.0)
    assert eq4_comm(4.0, 5.0, 1, 1, 4) == eq3_comm(4.0, 5.0, 4)


def test_eq6_eq7_recursions_give_gpipes_bubble() -> None:
    # K = 4 uniform GPUs, per micro-batch compute t = 3 (T_gpu = m t), no communication:
    # GPU k waits (k-1) t for upstream and (K-k) t for downstream: (K-1) t in all (GPipe)
    m, t = 8, 3.0
    compute, comm = [m * t] * 4, [0.0] * 4
    assert eq6_upstream(comm, compute, m) == [0.0, 3.0, 6.0, 9.0]
    assert eq7_downstream(comm, compute, m) == [9.0, 6.0, 3.0, 0.0]
    up, down = eq6_upstream(comm, compute, m), eq7_downstream(comm, compute, m)
    assert {eq5_bubble(u, d) for u, d in zip(up, down)} == {9.0}


def test_eq6_adds_each_upstream_gpus_communication() -> None:
    assert eq6_upstream([2.0, 4.0, 0.0], [8.0, 8.0, 8.0], 2) == [0.0, 5.0, 11.0]
    assert eq7_downstream([2.0, 4.0, 6.0], [8.0, 8.0, 8.0], 2) == [13.0, 7.0, 0.0]


def test_eq8_models_scale_with_pipelines_data_with_micro_batch_size() -> None:
    assert eq8_memory(100.0, 40.0, 4, 1, 4, 1) == 140.0
    assert eq8_memory(100.0, 40.0, 4, 1, 8, 1) == 120.0    # half-size micro-batches
    assert eq8_memory(100.0, 40.0, 4, 1, 2, 3) == 300.0 + 240.0
