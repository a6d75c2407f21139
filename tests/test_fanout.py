"""Ballot and Deadline without servers: fake nodes whose replies the test resolves, one at a time.

The real event loop runs the callbacks; the nodes are the shared fakes (tests/fakes.py), of which a
Ballot reads ``name``, ``quarantined_until`` and ``load.rto``; each reply is a future the test sets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from redlock_async._core._algorithm import Verdict, Vote
from redlock_async._nodes._node import Node
from redlock_async._nodes._wire import Failure, Reply
from redlock_async._rounds._deadline import Deadline
from redlock_async._rounds._fanout import Ballot, vote_of_script, vote_of_set

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


def _suspect(node: Node, vouch_for: float) -> None:
    """Node met without marker while others have theirs: sitting out, its first recheck pending."""
    node.quarantined_until = time.monotonic() + 30
    node.vouching = []
    node.vouch_until = time.monotonic() + vouch_for


def _settle(node: Node, *, marked: bool) -> None:
    """What the Quarantine does once that recheck answers (marked: another client judged it in service)."""
    if marked:
        node.quarantined_until = 0.0
    waiting, node.vouching = node.vouching, None
    for count in waiting or ():
        count()


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "still-unmarked"])
async def test_a_suspects_yes_waits_for_its_recheck(marked: bool) -> None:
    nodes, futures = fake_nodes(), replies()
    for i in (0, 1):
        _suspect(nodes[i], vouch_for=5.0)
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=0.02)
    for i in range(3):
        futures[i].set_result(b"OK")
    for i in (3, 4):
        futures[i].set_result(None)  # held for someone else
    await asyncio.sleep(0.1)  # past the 20 ms timeout: the held votes keep it open
    assert ballot.verdict is Verdict.UNDECIDED
    assert ballot.votes[:2] == [Vote.PENDING, Vote.PENDING]
    _settle(nodes[0], marked=marked)
    if marked:
        assert ballot.verdict is Verdict.UNDECIDED  # 2 yes, 2 no, one still held
        _settle(nodes[1], marked=True)
        assert await ballot.wait() is Verdict.WON
        assert ballot.votes[:3] == [Vote.YES] * 3
    else:
        assert await ballot.wait() is Verdict.LOST  # 1 yes and 3 refused: decided, the other held one refused too
        assert ballot.votes[:2] == [Vote.QUARANTINED, Vote.QUARANTINED]
        assert ballot.details is not None
        assert "quarantine" in ballot.details[1]


async def test_a_suspects_yes_is_held_no_longer_than_its_recheck_may_take() -> None:
    nodes, futures = fake_nodes(), replies()
    started = time.monotonic()  # before the hold's end is set from the clock: it ends 0.1 s after this at the soonest
    _suspect(nodes[0], vouch_for=0.1)
    ballot = Ballot.of(nodes, futures, vote_of_set, timeout=0.02)
    for i in range(3):
        futures[i].set_result(b"OK")
    for i in (3, 4):
        futures[i].set_result(None)
    assert await asyncio.wait_for(ballot.wait(), 2.0) is Verdict.LOST  # the recheck never answered
    assert time.monotonic() - started >= 0.1
    assert ballot.votes[0] is Vote.QUARANTINED


async def test_a_release_does_not_hold_a_suspects_yes() -> None:
    """Only majority ballots wait: a release's yes on a suspect is counted as it comes."""
    nodes, futures = fake_nodes(), replies()
    _suspect(nodes[0], vouch_for=5.0)
    ballot = Ballot.of(nodes, futures, vote_of_script, timeout=5.0, majority=False, wait_for=[0])
    futures[0].set_result(1)
    assert await asyncio.wait_for(ballot.wait(), 1.0) is Verdict.WON
    assert nodes[0].vouching == []


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
