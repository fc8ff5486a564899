"""The model of NCCL point-to-point (:mod:`pipeweave.ir.rendezvous`) on literal posts."""

from __future__ import annotations

from pipeweave.ir.rendezvous import P2P, Group, run_posted


def send(peer: int, tag: int) -> P2P:
    return P2P(True, peer, tag)


def recv(peer: int, tag: int) -> P2P:
    return P2P(False, peer, tag)


def one(*ops: P2P, channel: str = "group") -> Group:
    return Group(tuple(ops), channel)


def test_a_receive_posted_before_the_send_the_peer_waits_for_is_a_ring() -> None:
    # 1F1B's steady state, each rank with an early receive:  a: SF0 | RB0 | SF1
    #                                                          b: RF0 | RF1 | SB0
    outcome = run_posted({0: [one(send(1, 0)), one(recv(1, 9)), one(send(1, 1))],
                          1: [one(recv(0, 0)), one(recv(0, 1)), one(send(0, 9))]})
    assert not outcome.completed and outcome.cycle == (0, 1)
    assert "recv 9 from 1" in outcome.waits[0] and "recv 1 from 0" in outcome.waits[1]
    assert "deadlock (cycle 0 -> 1 -> 0)" in str(outcome)


def test_crossing_operations_in_one_group_complete() -> None:
    outcome = run_posted({0: [one(send(1, 0)), one(recv(1, 9), send(1, 1))],
                          1: [one(recv(0, 0)), one(send(0, 9), recv(0, 1))]})
    assert outcome.completed and str(outcome) == "every group completed"


def test_the_same_order_on_both_sides_completes_one_by_one() -> None:
    outcome = run_posted({0: [one(send(1, 0)), one(send(1, 1)), one(recv(1, 9))],
                          1: [one(recv(0, 0)), one(recv(0, 1)), one(send(0, 9))]})
    assert outcome.completed


def test_a_ring_of_three_ranks_over_one_communicator_each() -> None:
    # each rank first receives from the next, which first receives from its own next
    outcome = run_posted({r: [one(recv((r + 1) % 3, r)), one(send((r + 2) % 3, (r + 2) % 3))]
                          for r in range(3)})
    assert not outcome.completed and sorted(outcome.cycle) == [0, 1, 2]


def test_no_tags_in_nccl_a_send_meets_the_first_receive() -> None:
    outcome = run_posted({0: [one(send(1, 1)), one(send(1, 2))],
                          1: [one(recv(0, 2)), one(recv(0, 1))]})
    assert outcome.mismatch == "rank 0's send 1 to 1 met rank 1's recv 2 from 0"


def test_operations_on_different_communicators_never_meet() -> None:
    outcome = run_posted({0: [one(send(1, 0), channel="group")],
                          1: [one(recv(0, 0), channel="pair 0-1")]})
    assert not outcome.completed and "never posts" in outcome.waits[0]
    assert outcome.cycle == ()


def test_communicators_run_independently() -> None:
    # the pair's stream is not held up by a group still waiting on the other communicator
    outcome = run_posted({0: [one(recv(1, 5), channel="group"), one(send(1, 6), channel="pair")],
                          1: [one(recv(0, 6), channel="pair"), one(send(0, 5), channel="group")]})
    assert outcome.completed
