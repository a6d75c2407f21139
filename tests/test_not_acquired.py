"""What ``async with lock`` raises when it cannot acquire: contention (``LockNotAcquired``) or nodes that
could not vote (``NodesUnavailable``), told apart by the votes of the last attempt, on real servers."""

from __future__ import annotations

import logging
import re

import pytest

from redlock_async import EventKind, LockEvent, LockNotAcquired, NodesUnavailable, Redlock, Vote
from redlock_async.testing import LocalNodes

from .conftest import Cluster, MakeRedlock, dead_urls, own_server


@pytest.mark.parametrize("queue", [False, True], ids=["plain", "queue"])
@pytest.mark.parametrize("wait", [0.0, 0.3], ids=["one-try", "waiting"])
async def test_every_node_down_is_unavailable_not_busy(queue: bool, wait: float) -> None:
    async with Redlock(dead_urls(3), queue=queue) as redlock:
        with pytest.raises(NodesUnavailable) as caught:
            async with redlock.lock("orders", acquire_timeout=wait):
                pass
    error = caught.value
    assert isinstance(error, LockNotAcquired)  # handlers of LockNotAcquired still catch it
    # (Plain: decided at the second refusal, the third not needed; the grant queue hears every node.)
    assert re.search(r"nodes unavailable: 0 of 3 nodes answered, [23] could not \(a majority is 2\)", str(error))
    assert error.retry_after is None  # no one can say when a node that refuses connections comes back
    # The votes say why, node by node (with the grant queue too, which kept none before).
    assert error.outcomes
    assert all("Connection refused" in o.detail for o in error.outcomes if o.vote is not Vote.PENDING)


async def test_a_wrong_password_on_every_node_is_unavailable_not_busy() -> None:
    with own_server(password="s3cret") as a, own_server(password="s3cret") as b, own_server(password="s3cret") as c:
        urls = [server.url.replace("redis://", "redis://:wrong@") for server in (a, b, c)]
        async with Redlock(urls) as redlock:
            with pytest.raises(NodesUnavailable) as caught:
                async with redlock.lock("orders", acquire_timeout=0.2):
                    pass
    # 2 (a first try decided early) or 3 (a try in the grant queue waits for every node): all failed.
    assert re.search(r"0 of 3 nodes answered, [23] could not", str(caught.value)), caught.value
    assert any("AUTH" in o.detail or "WRONGPASS" in o.detail for o in caught.value.outcomes), caught.value


async def test_contention_is_never_unavailable(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Held by another client on every node: a plain LockNotAcquired, waiting or not."""
    holder, other = await make_redlock(), await make_redlock()
    held = holder.lock("busy", ttl=10.0)
    assert await held.acquire()
    for wait in (0.0, 0.2):
        with pytest.raises(LockNotAcquired) as caught:
            async with other.lock("busy", acquire_timeout=wait):
                pass
        assert type(caught.value) is LockNotAcquired, caught.value
        assert "unavailable" not in str(caught.value)
    await held.release()


async def test_held_with_a_minority_down_is_contention(faulty: Cluster) -> None:
    """2 of 5 nodes down, the lock held on the other 3: the holder leaving would let it be had."""
    async with Redlock(faulty.urls) as holder, Redlock(faulty.urls) as other:
        held = holder.lock("busy", ttl=10.0)
        assert await held.acquire()
        faulty[3].kill()
        faulty[4].kill()
        with pytest.raises(LockNotAcquired) as caught:
            async with other.lock("busy", acquire_timeout=0):
                pass
        assert type(caught.value) is LockNotAcquired, caught.value


async def test_held_on_a_minority_while_a_majority_is_silent_is_unavailable(faulty: Cluster) -> None:
    """The mixed case: 2 nodes answer "held", 3 time out. No majority could have granted the lock even
    had the holder let go, so the nodes are the cause: NodesUnavailable, which says what was seen."""
    async with Redlock(faulty.urls) as holder, Redlock(faulty.urls) as other:
        held = holder.lock("busy", ttl=10.0, auto_extend=False)
        assert await held.acquire()
        await other.connect()
        for i in (2, 3, 4):
            faulty[i].pause()
        try:
            with pytest.raises(NodesUnavailable) as caught:
                async with other.lock("busy", acquire_timeout=0):
                    pass
        finally:
            for i in (2, 3, 4):
                faulty[i].resume()
    text = str(caught.value)
    assert "2 of 5 nodes answered, 3 could not (a majority is 3); 2 found it held" in text, text
    votes = [o.vote for o in caught.value.outcomes]
    assert votes[:2] == [Vote.NO, Vote.NO], votes
    assert set(votes[2:]) <= {Vote.TIMEOUT, Vote.PENDING}, votes


async def test_nodes_vouched_for_under_a_shorter_quarantine_say_so_and_for_how_long(faulty: Cluster) -> None:
    """A client with ttl 1 marks the nodes in service under its short quarantine; a client with ttl 60
    sits them out for its own: the error says restart quarantine and when a majority counts again."""
    async with Redlock(faulty.urls, ttl=1.0) as short, short.lock("job"):
        pass
    async with Redlock(faulty.urls, ttl=60.0) as long:
        with pytest.raises(NodesUnavailable) as caught:
            async with long.lock("job", acquire_timeout=0.2):
                pass
    error = caught.value
    assert error.retry_after is not None, error
    assert 50 < error.retry_after <= 61, error
    assert re.search(r"in restart quarantine: a majority can vote again in [0-9.]+ s", str(error)), error
    quarantined = [o for o in error.outcomes if o.vote is Vote.QUARANTINED]
    assert len(quarantined) >= 3, error.outcomes
    for outcome in quarantined:
        assert "vouched for only under a shorter quarantine than ours" in outcome.detail, outcome
        assert "counts again in" in outcome.detail
    assert "held" not in str(error).replace("threshold", "")


async def test_one_warning_per_node_it_cannot_reach(caplog: pytest.LogCaptureFixture) -> None:
    """Each node's connections (votes, and waking waiters) fail alike: one warning each, not one per connection."""
    urls = dead_urls(3)
    with caplog.at_level(logging.WARNING, logger="redlock_async"):
        async with Redlock(urls) as redlock:
            with pytest.raises(NodesUnavailable):
                async with redlock.lock("x", acquire_timeout=0.3):  # waits: the subscriber connections too
                    pass
    for url in urls:
        address = url.removeprefix("redis://")
        said = [r for r in caplog.records if r.levelno == logging.WARNING and f"node {address}: cannot" in r.message]
        assert len(said) == 1, [r.message for r in caplog.records]


@pytest.mark.serial  # a 200 ms round trip against timers: load skews it
async def test_a_timeout_says_what_timed_out_and_which_setting_to_change() -> None:
    """adaptive_timeout=False and a long round trip: each node's timeout says node_timeout waits less than
    its round trip, and how to fix it (the detail was empty). 200 ms: beyond even the second window a
    ballot gives replies when its timer fires late (a loaded machine), where 60 ms sometimes wins."""
    with LocalNodes(3, proxied=True) as nodes:
        for node in nodes:
            node.proxy.latency(0.1)
        errors: list[NodesUnavailable] = []
        async with Redlock(nodes.urls, adaptive_timeout=False) as redlock:
            for _ in range(3):
                try:
                    async with redlock.lock("far", acquire_timeout=0.3):
                        pass
                except NodesUnavailable as exc:
                    errors.append(exc)
    assert len(errors) == 3
    for error in errors:
        timeouts = [o for o in error.outcomes if o.vote is Vote.TIMEOUT]
        assert timeouts, error.outcomes
        for outcome in timeouts:
            assert re.fullmatch(
                r"no reply within 50 ms, less than its round trip \(~[0-9]+ ms\): "
                r"turn adaptive_timeout on, or raise node_timeout",
                outcome.detail,
            ), outcome.detail


async def test_closing_with_one_lock_held_says_lock_was(
    make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    redlock = await make_redlock()
    lock = redlock.lock("left-held")
    assert await lock.acquire()
    with caplog.at_level(logging.WARNING, logger="redlock_async"):
        await redlock.aclose()
    assert any("closed while 1 lock was held ('left-held')" in r.message for r in caplog.records), caplog.text


async def test_synchronized_skips_a_busy_lock_but_never_unavailable_nodes() -> None:
    """on_busy="skip" is for a lock held elsewhere: with every node down the call must not vanish."""
    async with Redlock(dead_urls(3)) as redlock:

        @redlock.synchronized("report:{n}", blocking=False, on_busy="skip")
        async def report(n: int) -> int:
            return n

        with pytest.raises(NodesUnavailable):
            await report(1)


def test_blocking_synchronized_skips_a_busy_lock_but_never_unavailable_nodes() -> None:
    from redlock_async.sync import Redlock as BlockingRedlock

    with BlockingRedlock(dead_urls(3)) as redlock:

        @redlock.synchronized("report:{n}", blocking=False, on_busy="skip")
        def report(n: int) -> int:
            return n

        with pytest.raises(NodesUnavailable):
            report(1)


async def test_the_not_acquired_event_says_unavailable_or_not(make_redlock: MakeRedlock) -> None:
    """Metrics tell an outage from contention by the event's reason, as handlers do by the class."""
    events: list[LockEvent] = []
    async with Redlock(dead_urls(3), on_event=events.append) as down:
        assert not await down.lock("x").acquire(blocking=False)
    holder, other = await make_redlock(), await make_redlock(on_event=events.append)
    held = holder.lock("x")
    assert await held.acquire()
    assert not await other.lock("x").acquire(blocking=False)
    await held.release()
    reasons = [event.reason for event in events if event.kind is EventKind.NOT_ACQUIRED]
    assert reasons == ["nodes unavailable: too few nodes could vote", "no majority (blocking=False)"]
