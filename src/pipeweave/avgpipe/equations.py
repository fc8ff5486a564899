"""AvgPipe's performance and memory model: Equations 1-8 of avgpipe.txt §5.2, one function each.

A profile of one setting (``M = m`` micro-batches per batch, ``N = n`` parallel pipelines)
predicts another (``m*``, ``n*``). Per GPU (rank) ``k`` of ``K``::

    T^k      = T^k_gpu + T^k_com + T^k_bub                                        (1)
    T^k_gpu* = (m* n)/(m n*) (T^k_gpu + ∫ max((m n*)/(m* n) φ^k(t) - 1, 0) dt)      (2)
    T^k_com* = 𝕋^k/m* + (m* - 1)/m* · max(𝕋^k - T^k_gpu*, 0)        (N = n)       (3)
    T^k_com* = n*/(m* n) 𝕋^k + (m* - 1)/m* · max(n*/n 𝕋^k - T^k_gpu*, 0)           (4)
    T^k_bub* = T^k_up* + T^k_down*                                                 (5)
    T^k_up*  = T^{k-1}_up* + ((𝕋^{k-1})* + (T^{k-1}_gpu)*)/m*,    T^1_up* = 0       (6)
    T^k_down*= T^{k+1}_down* + ((𝕋^{k+1})* + (T^{k+1}_gpu)*)/m*,  T^K_down* = 0     (7)
    F^k*     = n*/n F^k_mod + (m n*)/(m* n) F^k_dat                                 (8)

``φ^k(t)`` is the utilisation of GPU ``k``'s compute resource over time (1 = fully used), ``𝕋^k``
the total communication time of GPU ``k`` (blocking or not), ``T^k_com`` the part of it that
blocks the GPU, ``F_mod`` the parallel and reference models' memory, ``F_dat`` the data and
intermediate results. The paper predicts AFAB's time (§5.2.2: advance forward propagation
makes 1F1B close to it).

Equation 2 needs only how long ``φ`` spends at each level, not when, so a curve is passed as
a histogram: ``(level, seconds)`` pairs. The functions are pure arithmetic; which units the
inputs are in (per batch or per iteration) is the caller's choice, see
:mod:`pipeweave.avgpipe.tuner`.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Utilisation", "eq1_time", "eq2_compute", "eq3_comm", "eq4_comm", "eq5_bubble",
           "eq6_upstream", "eq7_downstream", "eq8_memory", "overflow"]

Utilisation = Sequence[tuple[float, float]]
"""``φ(t)`` as ``(level, seconds)`` pairs: the curve spends ``seconds`` at ``level``."""


def eq1_time(compute: float, comm: float, bubble: float) -> float:
    """Equation 1: ``T = T_gpu + T_com + T_bub``."""
    return compute + comm + bubble


def overflow(utilisation: Utilisation, scale: float) -> float:
    """``∫ max(scale · φ(t) - 1, 0) dt``: the shaded area of Fig. 8, where the scaled curve
    would use more than the whole resource."""
    return sum(max(scale * level - 1.0, 0.0) * seconds for level, seconds in utilisation)


def eq2_compute(compute: float, utilisation: Utilisation, m: int, n: int, m_star: int,
                n_star: int) -> float:
    """Equation 2: computation time at ``(m*, n*)`` from ``T_gpu`` and ``φ`` at ``(m, n)``.

    The micro-batch is ``m/m*`` the size, so (the paper's simplification) the arithmetic
    intensity and with it ``φ`` are ``m/m*`` of the profile's; ``n*/n`` as many pipelines share
    the GPU, so ``φ* = (m n*)/(m* n) φ``. The computation volume of a batch is fixed, so where
    ``φ* <= 1`` the time is ``(m* n)/(m n*)`` of the profile's; where ``φ*`` would exceed 1 the
    excess is extra time (the overflow integral).
    """
    scale = (m * n_star) / (m_star * n)
    return (m_star * n) / (m * n_star) * (compute + overflow(utilisation, scale))


def eq3_comm(total: float, compute_star: float, m_star: int) -> float:
    """Equation 3 (``N = n``): communication that blocks the GPU at ``M = m*``.

    A micro-batch's share of the total is ``𝕋/m*``; the first micro-batch's transfer blocks in
    full, each of the other ``m* - 1`` blocks by what the computation cannot hide (Fig. 9).
    """
    return eq4_comm(total, compute_star, 1, 1, m_star)


def eq4_comm(total: float, compute_star: float, n: int, n_star: int, m_star: int) -> float:
    """Equation 4: blocking communication at ``(m*, n*)``; ``n*/n`` the pipelines send
    ``n*/n`` the data, ``(𝕋)* = n*/n 𝕋``, and ``compute_star`` is Equation 2's ``T_gpu*``."""
    total_star = n_star / n * total
    return total_star / m_star + (m_star - 1) / m_star * max(total_star - compute_star, 0.0)


def eq5_bubble(upstream: float, downstream: float) -> float:
    """Equation 5: ``T_bub = T_up + T_down``."""
    return upstream + downstream


def eq6_upstream(comm_star: Sequence[float], compute_star: Sequence[float],
                 m_star: int) -> list[float]:
    """Equation 6, for every GPU: waiting for upstream GPUs.

    GPU ``k`` waits for GPU ``k-1`` to receive the first micro-batch's data and compute it,
    ``((𝕋^{k-1})* + (T^{k-1}_gpu)*)/m*``, on top of what GPU ``k-1`` itself waited.
    ``comm_star[k]`` is ``(𝕋^k)*`` (Equation 4's ``n*/n 𝕋^k``), ``compute_star[k]`` Equation 2.
    """
    _check_same_length(comm_star, compute_star)
    up = [0.0] * len(compute_star)
    for k in range(1, len(up)):
        up[k] = up[k - 1] + (comm_star[k - 1] + compute_star[k - 1]) / m_star
    return up


def eq7_downstream(comm_star: Sequence[float], compute_star: Sequence[float],
                   m_star: int) -> list[float]:
    """Equation 7, for every GPU: waiting for downstream GPUs (the mirror of Equation 6)."""
    _check_same_length(comm_star, compute_star)
    down = [0.0] * len(compute_star)
    for k in range(len(down) - 2, -1, -1):
        down[k] = down[k + 1] + (comm_star[k + 1] + compute_star[k + 1]) / m_star
    return down


def eq8_memory(model: float, data: float, m: int, n: int, m_star: int, n_star: int) -> float:
    """Equation 8: ``F* = n*/n F_mod + (m n*)/(m* n) F_dat``.

    ``M`` leaves the models alone and scales the data with the micro-batch size (``m/m*``);
    ``n*/n`` the pipelines hold ``n*/n`` of both.
    """
    return n_star / n * model + (m * n_star) / (m_star * n) * data


def _check_same_length(a: Sequence[float], b: Sequence[float]) -> None:
    assert len(a) == len(b), (len(a), len(b))
