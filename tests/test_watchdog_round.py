"""The watchdog's rounds without servers, on virtual time.

The nodes are fakes whose EXTEND replies the test resolves; the event loop is looptime's,
whose clock only moves when the loop would otherwise wait, and the library reads that same
clock (``_clock.use(loop.time)``). So a test can say "node 4 answers 30 ms after the others"
or "the loop stalls 2 s" and get exact, repeatable times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from redlock_async._core import _clock
from redlock_async._core._algorithm import Vote
from redlock_async._nodes._wire import Failure, Reply
from redlock_async._rounds._lease import Lease
from redlock_async._shared._watchdog import Watchdog

from .fakes import FakeNode, as_nodes, fake_nodes, virtual

NODE_TIMEOUT = 0.05


@dataclass
class Decision:
    started: float
    decided_at: float
    votes: list[Vote]
    details: list[str] | None


def watched(key: bytes, expires: float, decisions: list[Decision]) -> Lease:
    lease = Lease((key,), b"token-" + key, ttl_ms=1000, acquired_at=_clock.now(), expires=expires)

    def result(
        lease: Lease, started: float, decided_at: float, votes: Sequence[Vote], details: Sequence[str] | None
    ) -> None:
        decisions.append(Decision(started, decided_at, list(votes), list(details) if details else None))

    lease.due, lease.result = (lambda lease, now: True), result
    return lease


def answer(nodes: list[FakeNode], which: Sequence[int], reply: Reply) -> None:
    for i in which:
        nodes[i].answer(reply, latest=True)


def test_a_majority_decides_a_round_early_and_late_replies_change_nothing() -> None:
    async def test() -> None:
        nodes = fake_nodes(5)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        decisions: list[Decision] = []
        start = _clock.now()
        watchdog.schedule(watched(b"k", start + 1.0, decisions), start + 0.3)
        await asyncio.sleep(0.31)  # the round went out at 0.3 s
        assert all(len(node.sent) == 1 for node in nodes)
        answer(nodes, [0, 1], [1])
        await asyncio.sleep(0.01)
        assert decisions == []
        answer(nodes, [2], [1])
        await asyncio.sleep(0)
        assert len(decisions) == 1
        assert decisions[0].votes == [Vote.YES, Vote.YES, Vote.YES, Vote.PENDING, Vote.PENDING]
        assert abs(decisions[0].decided_at - (start + 0.32)) < 1e-6  # at the third yes, exactly
        answer(nodes, [3, 4], [0])
        await asyncio.sleep(0.01)
        assert len(decisions) == 1  # decided once
        await watchdog.aclose()

    virtual(test)


def test_silent_nodes_are_waited_for_until_the_lease_ends_not_one_node_timeout() -> None:
    """Under load replies queue behind other commands: a round waits while its lease lasts."""

    async def test() -> None:
        nodes = fake_nodes(5)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        decisions: list[Decision] = []
        start = _clock.now()
        watchdog.schedule(watched(b"k", start + 1.0, decisions), start + 0.3)
        await asyncio.sleep(0.31)
        answer(nodes, [0, 1], [1])
        await asyncio.sleep(0.5)  # ten node timeouts later: still waiting, the lease has 0.19 s left
        assert decisions == []
        await asyncio.sleep(0.3)  # past the lease's end
        assert len(decisions) == 1
        assert decisions[0].votes == [Vote.YES, Vote.YES, Vote.TIMEOUT, Vote.TIMEOUT, Vote.TIMEOUT]
        assert decisions[0].decided_at >= start + 1.0 - NODE_TIMEOUT / 10
        await watchdog.aclose()

    virtual(test)


def test_one_round_carries_many_leases_and_decides_each_on_its_own() -> None:
    async def test() -> None:
        nodes = fake_nodes(3)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        first: list[Decision] = []
        second: list[Decision] = []
        start = _clock.now()
        watchdog.schedule(watched(b"a", start + 1.0, first), start + 0.3)
        watchdog.schedule(watched(b"b", start + 1.0, second), start + 0.31)  # within the batch window
        await asyncio.sleep(0.35)
        assert all(len(node.sent) == 1 for node in nodes)  # one call per node for both
        assert watchdog.rounds == 1
        answer(nodes, [0, 1], [1, 0])  # a: yes, b: no (gone)
        await asyncio.sleep(0)
        assert first[0].votes == [Vote.YES, Vote.YES, Vote.PENDING]
        assert second[0].votes == [Vote.NO, Vote.NO, Vote.PENDING]
        await watchdog.aclose()

    virtual(test)


def test_a_quarantined_yes_and_a_failure_carry_their_words() -> None:
    async def test() -> None:
        nodes = fake_nodes(3)
        nodes[0].quarantined_until = _clock.now() + 60
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        decisions: list[Decision] = []
        start = _clock.now()
        watchdog.schedule(watched(b"k", start + 1.0, decisions), start + 0.3)
        await asyncio.sleep(0.31)
        answer(nodes, [0], [1])
        answer(nodes, [1], Failure(Vote.ERROR, "connection lost"))
        await asyncio.sleep(0)
        assert decisions[0].votes == [Vote.QUARANTINED, Vote.ERROR, Vote.PENDING]  # no majority possible
        assert decisions[0].details is not None
        assert "quarantine" in decisions[0].details[0]
        assert decisions[0].details[1] == "connection lost"
        await watchdog.aclose()

    virtual(test)


def test_a_lease_no_longer_due_is_not_sent() -> None:
    async def test() -> None:
        nodes = fake_nodes(3)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        decisions: list[Decision] = []
        start = _clock.now()
        lease = watched(b"k", start + 1.0, decisions)
        lease.due = lambda lease, now: False  # released, lost or at its hold limit meanwhile
        watchdog.schedule(lease, start + 0.3)
        await asyncio.sleep(0.5)
        assert all(node.sent == [] for node in nodes)
        assert watchdog.rounds == 0
        await watchdog.aclose()

    virtual(test)
