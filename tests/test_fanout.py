"""Ballot and Deadline without servers: fake nodes whose replies the test resolves, one at a time.

The real event loop runs the callbacks; the nodes are the shared fakes (tests/fakes.py), of which a
Ballot reads ``name``, ``quarantined_until`` and ``load.rto``; each reply is a future the test sets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from redlock_async._algorithm import Verdict, Vote
from redlock_async._deadline import Deadline
from redlock_async._fanout import Ballot, vote_of_script, vote_of_set
from redlock_async._node import Node
from redlock_async._wire import Failure, Reply

from .fakes import as_nodes
from .fakes import fake_nodes as fakes


def fake_nodes(n: int = 5) -> list[Node]:
    return as_nodes(fakes(n))


def replies(n: int = 5) -> list[asyncio.Future[Reply]]:
    loop = asyncio.get_running_loop()
    return [loop.create_future() for _ in range(n)]


async def test_a_majority_of_yes_decides_before_the_others_answer() -> None:
    nodes, futures = fake_nodes(), replies()
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=5.0)
    for i in (0, 1):
        futures[i].set_result(b"OK")
    await asyncio.sleep(0)
    assert ballot.verdict is Verdict.UNDECIDED
    futures[2].set_result(b"OK")
    assert await asyncio.wait_for(ballot.wait(), 1.0) is Verdict.WON  # long before the 5 s timeout
    assert ballot.votes == [Vote.YES, Vote.YES, Vote.YES, Vote.PENDING, Vote.PENDING]


async def test_a_late_reply_does_not_change_a_decided_ballot() -> None:
    nodes, futures = fake_nodes(), replies()
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=5.0)
    for i in (0, 1, 2):
        futures[i].set_result(None)  # SET NX: the key exists
    assert await ballot.wait() is Verdict.LOST
    decided_at = ballot.decided_at
    for i in (3, 4):
        futures[i].set_result(b"OK")
    await asyncio.sleep(0)
    assert ballot.verdict is Verdict.LOST
    assert ballot.votes[3:] == [Vote.PENDING, Vote.PENDING]
    assert ballot.decided_at == decided_at


async def test_a_quarantined_yes_counts_against_the_quorum_and_says_why() -> None:
    nodes, futures = fake_nodes(), replies()
    cast(Any, nodes[0]).quarantined_until = time.monotonic() + 30
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=5.0)
    for i in range(3):
        futures[i].set_result(b"OK")
    await asyncio.sleep(0)
    assert ballot.verdict is Verdict.UNDECIDED  # 2 yes, 1 quarantined: not a majority yet
    futures[3].set_result(b"OK")
    assert await ballot.wait() is Verdict.WON
    assert ballot.votes[0] is Vote.QUARANTINED
    assert ballot.details is not None
    assert "quarantine" in ballot.details[0]


async def test_silent_nodes_time_out_and_errors_keep_their_words() -> None:
    nodes, futures = fake_nodes(), replies()
    ballot = Ballot.of(nodes, futures, vote_of_script, timeout=0.02)
    futures[0].set_result(1)
    futures[1].set_result(Failure(Vote.ERROR, "connection lost"))
    assert await asyncio.wait_for(ballot.wait(), 1.0) is Verdict.LOST
    assert ballot.votes == [Vote.YES, Vote.ERROR, Vote.TIMEOUT, Vote.TIMEOUT, Vote.TIMEOUT]
    assert ballot.details is not None
    assert ballot.details[1] == "connection lost"


async def test_a_release_ballot_waits_for_every_holder_only() -> None:
    nodes, futures = fake_nodes(), replies()
    ballot = Ballot.of(nodes, futures, vote_of_script, timeout=5.0, majority=False, wait_for=[1, 3])
    futures[1].set_result(1)
    await asyncio.sleep(0)
    assert ballot.verdict is Verdict.UNDECIDED
    futures[3].set_result(0)
    assert await asyncio.wait_for(ballot.wait(), 1.0) is Verdict.WON
    assert ballot.votes == [Vote.PENDING, Vote.YES, Vote.PENDING, Vote.NO, Vote.PENDING]


async def test_a_slow_node_measured_as_slow_gets_its_time() -> None:
    """The adaptive timeout: a ballot waits for the quorum-th fastest node's estimate."""
    nodes, futures = fake_nodes(3), replies(3)
    for node in nodes:
        node.load.rto = 0.15
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=0.01)
    await asyncio.sleep(0.05)  # past the 10 ms node_timeout, within the measured 150 ms
    assert ballot.verdict is Verdict.UNDECIDED
    for future in futures:
        future.set_result(b"OK")
    assert await ballot.wait() is Verdict.WON


async def test_a_deadline_late_because_the_loop_was_blocked_gives_a_fresh_window() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    started = time.monotonic()
    Deadline(loop, 0.1, lambda: fired.append(time.monotonic() - started))
    time.sleep(0.3)  # the loop is blocked past the deadline: replies may sit unread in the sockets
    await asyncio.sleep(0.01)
    assert fired == []  # not decided at the late firing: a fresh window of one timeout (0.1 s)
    await asyncio.sleep(0.3)
    assert len(fired) == 1
    assert fired[0] >= 0.3 + 0.1 - 0.002  # uvloop times to the millisecond


async def test_a_deadline_on_time_calls_back_after_three_loop_turns() -> None:
    loop = asyncio.get_running_loop()
    fired: list[bool] = []
    deadline = Deadline(loop, 0.0, lambda: fired.append(True))
    for _ in range(Deadline.TURNS):
        await asyncio.sleep(0)
        assert fired == []  # a reply already in a socket still gets its turns
    await asyncio.sleep(0.01)
    assert fired == [True]
    deadline.cancel()


@pytest.mark.parametrize(
    ("srtt", "max_rto", "said"),
    [
        (0.062, 0.0, "no reply within 20 ms, less than its round trip (~62 ms): "
                     "turn adaptive_timeout on, or raise node_timeout"),
        (0.062, 0.02, "no reply within 20 ms, less than its round trip (~62 ms): "
                      "raise ttl (the wait is at most ttl/10)"),
        (0.0, 0.0, "no reply within 20 ms: the node is slow, paused or cut off (node_timeout sets the wait)"),
    ],
    ids=["slower-than-the-wait", "adaptive-capped", "not-measured"],
)  # fmt: skip
async def test_a_timeout_says_what_timed_out_and_which_setting_to_change(
    srtt: float, max_rto: float, said: str
) -> None:
    nodes, futures = fake_nodes(3), replies(3)
    for node in nodes:
        node.load.srtt, node.load.max_rto = srtt, max_rto
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=0.02)
    futures[0].set_result(b"OK")
    assert await asyncio.wait_for(ballot.wait(), 1.0) is Verdict.LOST
    assert ballot.votes == [Vote.YES, Vote.TIMEOUT, Vote.TIMEOUT]
    assert ballot.details == ["", said, said]
