"""The Redlock algorithm against 5 real server processes."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from redlock_async import Lock, LockLost, LockNotAcquired, Redlock
from redlock_async._core._algorithm import Vote

from .conftest import (
    Cluster,
    MakeRedlock,
    assert_empty,
    assert_no_library_tasks,
    eventually,
    keys_on,
    lock_keys,
    mark_in_service,
)

KEY = "redlock:{}"


def values(cluster: Cluster, resource: str) -> list[object]:
    return [cluster[i].command("GET", KEY.format(resource)) for i in range(len(cluster))]


async def test_acquire_sets_same_token_with_pttl_on_every_node(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("orders:42", ttl=5.0)
    assert await lock.acquire(blocking=False)
    assert lock.held
    assert lock.token is not None
    assert len(lock.token) >= 27  # 20 random bytes, urlsafe base64
    assert 4.8 < lock.validity <= 5.0 - 5.0 * 0.01 - 0.002
    for i in range(len(cluster)):
        value, pttl = keys_on(cluster[i], KEY.format("orders:42"))
        assert value == lock.token.encode()
        assert 4000 < pttl <= 5000
    await lock.release()
    assert not lock.held
    assert lock.token is None
    assert await eventually(lambda: values(cluster, "orders:42") == [None] * len(cluster), 2.0)


async def test_a_lock_whose_validity_ran_out_can_be_acquired_again(cluster: Cluster, redlock: Redlock) -> None:
    """Acquired, not released, its validity ran out: acquire() takes it anew (with a new token), and the
    stale lease is released. Before, it raised IllegalMove ("a bug in redlock_async")."""
    lock = redlock.lock("ran-out", ttl=0.5)
    assert await lock.acquire(blocking=False)
    stale = lock.token
    await asyncio.sleep(0.6)
    assert not lock.held
    assert await lock.acquire(blocking=False)
    assert lock.held
    assert lock.token != stale
    await lock.release()
    await assert_empty(cluster)


async def test_tokens_are_new_for_every_acquisition(redlock: Redlock) -> None:
    lock = redlock.lock("tokens")
    seen = set()
    for _ in range(20):
        assert await lock.acquire(blocking=False)
        seen.add(lock.token)
        await lock.release()
    assert len(seen) == 20


async def test_mutual_exclusion_between_redlock_instances(make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(), await make_redlock()
    first, second = a.lock("shared"), b.lock("shared")
    assert await first.acquire(blocking=False)
    assert not await second.acquire(blocking=False)
    assert [o.vote for o in second.outcomes].count(Vote.NO) >= 3
    assert not await second.acquire(timeout=0.3)
    await first.release()
    assert await second.acquire(blocking=False), second.outcomes
    await second.release()


async def test_blocking_acquire_waits_for_release(make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(), await make_redlock(retry_delay=0.02)
    holder = a.lock("handoff")
    assert await holder.acquire()

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await holder.release()

    releaser = asyncio.create_task(release_soon())
    waiter = b.lock("handoff")
    assert await waiter.acquire(timeout=5.0)
    await releaser
    await waiter.release()


async def test_failed_acquire_leaves_no_keys(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(), await make_redlock()
    holder = a.lock("contended")
    assert await holder.acquire()
    # Another client that takes 2 nodes first: b wins those two, then loses the vote.
    assert holder.token is not None
    for i in (3, 4):
        cluster[i].command("DEL", KEY.format("contended"))
    loser = b.lock("contended")
    assert not await loser.acquire(blocking=False)
    # Three said no; the verdict may come before the last yes is in (PENDING).
    assert {o.vote for o in loser.outcomes[3:]} <= {Vote.YES, Vote.PENDING}
    # b's two keys were released: only the holder's token is left, on 3 nodes.
    assert values(cluster, "contended") == [holder.token.encode()] * 3 + [None, None]
    await holder.release()


async def test_release_never_deletes_another_holders_key(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(node_timeout=0.02), await make_redlock()
    stale = a.lock("expiring", ttl=0.3)
    assert await stale.acquire()
    await asyncio.sleep(0.35)  # the lease ran out
    assert not stale.held
    fresh = b.lock("expiring", ttl=5.0)
    assert await fresh.acquire(blocking=False)
    await stale.release()
    assert fresh.token is not None
    assert values(cluster, "expiring") == [fresh.token.encode()] * len(cluster)
    await fresh.release()


async def test_async_with_acquires_and_releases(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("ctx")
    async with lock as entered:
        assert entered is lock
        assert lock.held
        assert values(cluster, "ctx")[0] is not None
    assert not lock.held
    assert await eventually(lambda: values(cluster, "ctx") == [None] * len(cluster), 2.0)


async def test_async_with_raises_lock_not_acquired_with_votes(make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(), await make_redlock(retry_delay=0.01)
    async with a.lock("busy"):
        with pytest.raises(LockNotAcquired) as caught:
            async with b.lock("busy", acquire_timeout=0.1):
                pytest.fail("the body must not run")
    error = caught.value
    assert error.name == "busy"
    assert len(error.outcomes) == 5
    assert all(o.vote in (Vote.NO, Vote.PENDING) for o in error.outcomes)
    assert "busy" in str(error)
    assert "no" in str(error)


async def test_body_exception_passes_through_and_lock_is_released(cluster: Cluster, redlock: Redlock) -> None:
    class Boom(Exception):
        pass

    lock = redlock.lock("boom")
    with pytest.raises(Boom):
        async with lock:
            raise Boom
    assert await eventually(lambda: values(cluster, "boom") == [None] * len(cluster), 2.0)


async def test_cancelled_body_releases(cluster: Cluster, redlock: Redlock) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with redlock.lock("cancelled"):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: values(cluster, "cancelled") == [None] * len(cluster), 2.0)


async def test_extend_resets_pttl(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("long", ttl=1.0)
    assert await lock.acquire()
    await lock.extend(30.0)
    assert 29.0 < lock.validity <= 30.0
    for i in range(len(cluster)):
        assert int(keys_on(cluster[i], KEY.format("long"))[1]) > 29000
    await lock.extend()  # back to the lock's own ttl
    assert lock.validity <= 1.0
    await lock.release()


async def test_extend_after_expiry_is_lost_for_good(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(node_timeout=0.02)
    lock = redlock.lock("short", ttl=0.2)
    assert await lock.acquire()
    await asyncio.sleep(0.25)
    with pytest.raises(LockLost):
        await lock.extend()
    with pytest.raises(LockLost):
        await lock.extend()  # sticky
    assert not lock.held
    await lock.release()  # releasing a lost lock is allowed and does nothing
    # A new acquisition is a new lease.
    assert await lock.acquire(blocking=False)
    await lock.release()


async def test_extend_never_recreates_a_missing_key(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("vanished", ttl=5.0)
    assert await lock.acquire()
    cluster.flush()  # every key gone, as after an expiry
    with pytest.raises(LockLost) as caught:
        await lock.extend()
    assert [o.vote for o in caught.value.outcomes].count(Vote.YES) < 3
    assert await eventually(lambda: values(cluster, "vanished") == [None] * len(cluster), 2.0)


async def test_extend_fails_when_another_client_holds_a_majority(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("stolen", ttl=5.0)
    assert await lock.acquire()
    for i in range(3):
        cluster[i].command("SET", KEY.format("stolen"), "someone-else")
    with pytest.raises(LockLost):
        await lock.extend()
    # Our keys were freed; the other holder's were not touched.
    assert values(cluster, "stolen") == [b"someone-else"] * 3 + [None, None]


async def test_misuse_raises_runtime_error(redlock: Redlock) -> None:
    lock = redlock.lock("misuse")
    with pytest.raises(RuntimeError, match="not held"):
        await lock.release()
    with pytest.raises(RuntimeError, match="not held"):
        await lock.extend()
    assert await lock.acquire(blocking=False)
    with pytest.raises(RuntimeError, match="reentrant"):
        await lock.acquire(blocking=False)
    await lock.release()
    with pytest.raises(RuntimeError, match="not held"):
        await lock.release()


async def test_script_cache_flush_falls_back_to_eval(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("noscript")
    assert await lock.acquire()
    for i in range(len(cluster)):
        cluster[i].command("SCRIPT", "FLUSH")
    await lock.extend(5.0)
    assert lock.validity > 4.5
    for i in range(len(cluster)):
        cluster[i].command("SCRIPT", "FLUSH")
    await lock.release()
    # release() waits for the nodes that said yes to the extension; one that answered it late has its
    # release (here an EVAL after NOSCRIPT) land a moment later.
    assert await eventually(lambda: values(cluster, "noscript") == [None] * len(cluster), 2.0)


async def test_redis_clients_as_nodes_stay_open(cluster: Cluster) -> None:
    clients = [redis.asyncio.Redis.from_url(url) for url in cluster.urls]
    try:
        async with Redlock(clients) as redlock, redlock.lock("clients"):
            assert await clients[0].exists(KEY.format("clients")) == 1
        assert await clients[0].ping()  # the Redlock did not close what it did not make
    finally:
        for client in clients:
            await client.aclose()


async def test_closed_redlock_refuses_new_acquires(cluster: Cluster) -> None:
    redlock = Redlock(cluster.urls)
    lock = redlock.lock("closed")
    async with redlock:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await lock.acquire()
    assert_no_library_tasks()


async def test_lock_repr_and_public_names(redlock: Redlock) -> None:
    lock = redlock.lock("repr")
    assert isinstance(lock, Lock)
    assert repr(lock).startswith("<redlock_async.Lock 'repr' idle")
    assert type(lock).__module__ == "redlock_async"
    assert "password" not in repr(redlock)


# -- faults -------------------------------------------------------------------------


async def test_two_of_five_paused_still_acquires(faulty: Cluster) -> None:
    async with Redlock(faulty.urls) as redlock:
        faulty[0].pause()
        faulty[3].pause()
        lock = redlock.lock("minority")
        assert await lock.acquire(blocking=False)
        votes = [o.vote for o in lock.outcomes]
        assert votes.count(Vote.YES) == 3
        # Decided on the third yes: the paused nodes were not waited for.
        assert [votes[0], votes[3]] == [Vote.PENDING, Vote.PENDING]
        await lock.release()
        faulty[0].resume()
        faulty[3].resume()


@pytest.mark.slow
@pytest.mark.serial
async def test_three_of_five_paused_fails_fast_and_leaves_no_keys(faulty: Cluster) -> None:
    # node_timeout 0.2 s, not 0.05 s: the running nodes must answer within it for their votes to be
    # yes (CI, on a loaded box: all five timed out, "5 == 3").
    node_timeout, timeout = 0.2, 0.3
    async with Redlock(faulty.urls, node_timeout=node_timeout, retry_delay=0.01) as redlock:
        for i in (0, 1, 2):
            faulty[i].pause()
        lock = redlock.lock("majority-down")
        started = time.monotonic()
        assert not await lock.acquire(timeout=timeout)
        # Bounded by the acquire timeout plus one last attempt (its SETs, then its release: a node_timeout
        # each), never by the paused nodes (which never answer); 0.8 s here when idle, 1.0 s under load,
        # with 1 s of slack.
        assert time.monotonic() - started < timeout + 2 * node_timeout + 1.0
        assert [o.vote for o in lock.outcomes].count(Vote.TIMEOUT) == 3
        assert [faulty[i].command("GET", KEY.format("majority-down")) for i in (3, 4)] == [None, None]
        with pytest.raises(LockNotAcquired):
            async with redlock.lock("majority-down", acquire_timeout=0.1):
                pass
        for i in (0, 1, 2):
            faulty[i].resume()
        # The SETs queued to the paused nodes run on resume, each followed by its release.
        await asyncio.sleep(0.3)
        assert [faulty[i].command("GET", KEY.format("majority-down")) for i in range(5)] == [None] * 5
        assert await lock.acquire(blocking=False)
        await lock.release()


@pytest.mark.serial
async def test_three_of_five_killed_fails_at_once(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, node_timeout=0.5, ttl=10.0) as redlock:
        for i in (0, 1, 2):
            faulty[i].kill()
        lock = redlock.lock("killed")
        started = time.monotonic()
        assert not await lock.acquire(blocking=False)
        # Refused connections are failed votes at once: no waiting for the 0.5 s node timeout.
        assert time.monotonic() - started < 0.4
        assert all(o.vote in (Vote.ERROR, Vote.SKIPPED) for o in lock.outcomes[:3])
        assert [faulty[i].command("GET", KEY.format("killed")) for i in (3, 4)] == [None, None]


async def test_node_restart_reconnects(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, reconnect_delay=0.0) as redlock:
        lock = redlock.lock("restart")
        assert await lock.acquire()
        await lock.release()
        faulty[2].restart(keep_data=False)
        # The old connection is dead; the first attempt may lose that vote, later ones reconnect.
        for _ in range(3):
            assert await lock.acquire()
            await lock.release()
        assert await lock.acquire()
        # Reconnected: it answers again, but sits out its restart quarantine (see test_quarantine.py).
        votes = [o.vote for o in lock.outcomes]
        assert votes[2] in (Vote.QUARANTINED, Vote.PENDING)
        assert all(v in (Vote.YES, Vote.PENDING) for i, v in enumerate(votes) if i != 2)
        await lock.release()


async def test_cancelled_acquire_leaves_no_keys(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, node_timeout=1.0, ttl=30.0) as redlock:
        for i in (0, 1, 2):
            faulty[i].pause()
        task = asyncio.create_task(redlock.lock("cancel-me").acquire())
        await asyncio.sleep(0.1)  # the SETs are out; 2 yes, 3 waiting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        assert [faulty[i].command("GET", KEY.format("cancel-me")) for i in (3, 4)] == [None, None]
        for i in (0, 1, 2):
            faulty[i].resume()
        await asyncio.sleep(0.2)
        assert [faulty[i].command("GET", KEY.format("cancel-me")) for i in range(5)] == [None] * 5


async def test_stalled_node_backlog_is_capped(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, max_unanswered=8, connect_timeout=0.2) as redlock:
        faulty[4].pause()
        async with redlock.lock("cap-first"):
            pass
        await asyncio.sleep(0.3)  # silent for longer than connect_timeout: stalled
        for n in range(40):
            async with redlock.lock(f"cap{n}"):
                pass
            # Acquires stop queueing at the cap; releases only follow SETs that went out.
            assert redlock.statistics().nodes[4].unanswered <= 2 * 8
        lock = redlock.lock("cap-last")
        assert await lock.acquire()
        assert any(o.vote is Vote.SKIPPED and "stalled" in o.detail for o in lock.outcomes)
        await lock.release()
        faulty[4].resume()
        await asyncio.sleep(0.2)
        assert redlock.statistics().nodes[4].unanswered == 0
        assert lock_keys(faulty[4]) == []


async def test_busy_node_is_never_skipped(make_redlock: MakeRedlock) -> None:
    # Far more concurrent acquires than max_unanswered: a node that keeps answering is busy, not stalled.
    redlock = await make_redlock(max_unanswered=16, node_timeout=0.5)
    locks = [redlock.lock(f"burst{n}") for n in range(300)]
    results = await asyncio.gather(*(lock.acquire(blocking=False) for lock in locks))
    assert all(results)
    await asyncio.gather(*(lock.release() for lock in locks))


@pytest.mark.serial
async def test_paused_before_connect_still_acquires(faulty: Cluster) -> None:
    for i in range(len(faulty)):
        mark_in_service(faulty[i])  # a cluster in service: one met new with a node silent waits a period first
    faulty[1].pause()
    async with Redlock(faulty.urls, connect_timeout=0.2) as redlock:
        lock = redlock.lock("paused-at-start")
        assert await lock.acquire(blocking=False)
        assert lock.outcomes[1].vote in (Vote.PENDING, Vote.SKIPPED, Vote.TIMEOUT)
        await lock.release()
        faulty[1].resume()


@pytest.mark.slow
async def test_extend_with_majority_down_is_lost(faulty: Cluster) -> None:
    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("extend-down", ttl=2.0)
        assert await lock.acquire()
        for i in (0, 1, 2):
            faulty[i].pause()
        with pytest.raises(LockLost) as caught:
            await lock.extend()
        assert [o.vote for o in caught.value.outcomes].count(Vote.TIMEOUT) == 3
        for i in (0, 1, 2):
            faulty[i].resume()


@pytest.mark.parametrize("turns", [0, 1, 3])
async def test_loop_stall_is_not_a_node_timeout(redlock: Redlock, turns: int) -> None:
    # The loop is blocked longer than node_timeout right after the SETs were queued:
    # the nodes answered in time, their replies just sat unread. Still acquired.
    lock = redlock.lock(f"stalled-loop-{turns}")
    task = asyncio.create_task(lock.acquire(blocking=False))
    for _ in range(turns):
        await asyncio.sleep(0)
    time.sleep(redlock.settings.node_timeout + 0.01)
    assert await task
    assert Vote.TIMEOUT not in [o.vote for o in lock.outcomes]
    await lock.release()


async def test_extend_rides_out_a_short_majority_pause(faulty: Cluster) -> None:
    # Unconfirmed is not refused: extend retries while validity is left, and keeps the lock.
    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("brief-pause", ttl=10.0)
        assert await lock.acquire()
        for i in (0, 1, 2):
            faulty[i].pause()
        loop = asyncio.get_running_loop()
        for i in (0, 1, 2):
            loop.call_later(0.2, faulty[i].resume)
        await lock.extend()
        assert lock.held
        assert lock.validity > 9.0
        assert [faulty[i].command("GET", KEY.format("brief-pause")) for i in range(5)] == [lock.token.encode()] * 5  # type: ignore[union-attr]
        await lock.release()


async def test_blocking_false_with_a_timeout_is_refused(redlock: Redlock) -> None:
    lock = redlock.lock("contradiction")
    with pytest.raises(ValueError, match=r"blocking=False\) makes one attempt: a timeout means nothing"):
        await lock.acquire(blocking=False, timeout=5)
    assert await lock.acquire(blocking=False)
    await lock.release()
