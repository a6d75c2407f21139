"""``wait_replicas=N`` (issue 39 item 3): a yes counts only once N replicas acknowledged its write, on real
servers with replicas: a standalone master with a replica, a Cluster voter (the ``WAIT`` goes to the shard
primary that took the write) and a Sentinel voter. A replica stopped (SIGSTOP) makes every vote of its
master a failed one, and the failed acquire's cleanup leaves no key."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import LockLost, Redlock, Vote
from redlock_async._core import Settings
from redlock_async._nodes import Failure, Node, Resolve, endpoints_for, pack, replicated_outbox, wait_ms
from redlock_async.testing import LocalCluster, LocalNodes, LocalSentinels
from tests.conftest import eventually
from tests.test_cluster_voter import mark_shards

KEY = "redlock:wr"


def waits(node: Any) -> int:
    """How many WAITs *node* (a LocalNode) ran since its stats were last reset."""
    stats: Any = node.command("INFO", "commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def has(replica: Any, key: str) -> bool:
    """Whether a cluster replica holds *key* (SCAN: a read of a key would be redirected to its primary)."""
    reply: Any = replica.command("SCAN", 0, "MATCH", key, "COUNT", 10_000)
    return key.encode() in reply[1]


def slot_of(cluster: LocalCluster, key: str) -> int:
    reply: Any = cluster.nodes[0].command("CLUSTER", "KEYSLOT", key)
    return int(reply)


# -- the setting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, "at least 1"),
        (-2, ValueError, "at least 1"),
        (True, TypeError, "an int of at least 1"),
        (1.0, TypeError, "an int of at least 1"),
        ("1", TypeError, "an int of at least 1"),
    ],
)
def test_wait_replicas_is_checked(value: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        Settings(wait_replicas=value)  # type: ignore[arg-type]


def test_wait_replicas_turns_the_grant_queue_off_and_refuses_it_asked_for() -> None:
    assert Settings().queue is True
    assert Settings(wait_replicas=1).queue is False
    assert Settings(wait_replicas=2).wait_replicas == 2
    with pytest.raises(ValueError, match="queue=True cannot go with wait_replicas=1"):
        Settings(wait_replicas=1, queue=True)


def test_the_wait_s_timeout_is_the_node_timeout_and_never_zero() -> None:
    assert wait_ms(0.05) == 50
    assert wait_ms(0.0001) == 1  # WAIT's 0 would wait for ever


# -- a standalone master with a replica ------------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[LocalNodes]:
    """A master (nodes[0]) and its replica (nodes[1]), in sync."""
    with LocalNodes(2) as nodes:
        master, replica = nodes.nodes
        replica.command("REPLICAOF", "127.0.0.1", master.port)

        def synced() -> bool:
            info: Any = replica.command("INFO", "replication")
            return bool(info.get("master_link_status") == "up")

        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(eventually(synced, within=30.0)), "the replica never synced"
        finally:
            loop.close()
        yield nodes


async def test_a_vote_waits_for_its_replica_and_one_wait_covers_a_write_s_votes(pair: LocalNodes) -> None:
    master, replica = pair.nodes
    (endpoint,) = endpoints_for([pair.urls[0]])
    node = Node(
        endpoint,
        max_unanswered=100,
        stall_after=1.0,
        connect_timeout=1.0,
        reconnect_delay=0.1,
        outbox_type=replicated_outbox(1, 200),
    )
    try:
        assert await node.connect() is None
        master.command("CONFIG", "RESETSTAT")
        futures = []
        for i in range(5):  # five votes in one loop turn: one write, one WAIT behind them all
            fut = asyncio.get_running_loop().create_future()
            node.send_packed(Resolve(fut), 0, pack((b"SET", f"{KEY}{i}", b"v", b"PX", 60_000)), limited=True)
            futures.append(fut)
        plain = node.send(b"GET", f"{KEY}0")  # not a vote: no WAIT, no holding
        assert await asyncio.gather(*futures) == [b"OK"] * 5
        assert await plain == b"v"
        assert waits(master) == 1
        assert replica.command("GET", f"{KEY}4") == b"v"

        replica.pause()
        try:
            vote = node.send(b"SET", KEY, b"v", b"PX", 60_000, limited=True)
            reply = await asyncio.wait_for(vote, 5.0)
            # The write ran on the master, but no replica has it: the yes is a failed vote, saying why.
            assert isinstance(reply, Failure), reply
            assert reply.vote is Vote.TIMEOUT
            assert "0 of 1 replicas acknowledged the write within 200 ms (wait_replicas=1)" in reply.detail
            # A command's own failure (an error: nothing written) is handed on at once, with no WAIT.
            error = await asyncio.wait_for(node.send(b"INCR", KEY, limited=True), 5.0)
            assert isinstance(error, Failure)
            assert error.answered
            assert "not an integer" in error.detail
        finally:
            replica.resume()
    finally:
        await node.aclose(0.5)


async def test_a_script_the_server_lost_is_sent_again_and_waited_for_again(pair: LocalNodes) -> None:
    master, replica = pair.nodes
    async with Redlock([pair.urls[0]], wait_replicas=1, fencing=True, ttl=5.0) as redlock:
        await redlock.connect()
        lock = redlock.lock("wr")
        master.command("CONFIG", "RESETSTAT")
        assert await lock.acquire(blocking=False), lock.outcomes
        usual = waits(master)  # (a fenced acquire: the acquire's, the counter's)
        await lock.release()
        master.command("SCRIPT", "FLUSH")  # the EVALSHA meets NOSCRIPT: its EVAL goes behind the WAIT
        master.command("CONFIG", "RESETSTAT")
        assert await lock.acquire(blocking=False), lock.outcomes
        # Both scripts met NOSCRIPT: each EVAL sent again has a WAIT of its own behind it.
        assert waits(master) == 2 * usual, "an EVAL sent again went without a WAIT of its own"
        assert replica.command("GET", KEY) is not None
        await lock.release()


async def test_a_standalone_voter_s_yes_needs_its_replica(pair: LocalNodes) -> None:
    master, replica = pair.nodes
    async with Redlock([pair.urls[0]], wait_replicas=1, ttl=5.0) as redlock:
        await redlock.connect()
        lock = redlock.lock("wr")
        assert await lock.acquire(blocking=False), lock.outcomes
        assert replica.command("GET", KEY) == master.command("GET", KEY) is not None
        await lock.extend()  # an extension is a vote too: the replica acknowledged it
        replica.pause()
        try:
            with pytest.raises(LockLost):
                await lock.extend()
            await _fails_cleanly(redlock, master)
        finally:
            replica.resume()
        # Without the setting, the same node with its replica stopped counts the yes at once.
    replica.pause()
    try:
        async with Redlock([pair.urls[0]], ttl=5.0) as redlock:
            lock = redlock.lock("wr")
            assert await lock.acquire(blocking=False), lock.outcomes
            await lock.release()
    finally:
        replica.resume()


async def test_permits_readers_and_writers_wait_for_the_replica_too(pair: LocalNodes) -> None:
    master, replica = pair.nodes
    async with Redlock([pair.urls[0]], wait_replicas=1, ttl=5.0) as redlock:
        await redlock.connect()
        permits = redlock.semaphore("wr:permits", limit=2)
        rw = redlock.rw_lock("wr:rw")
        for primitive in (permits, rw.read(), rw.write()):
            assert await primitive.acquire(blocking=False), primitive
            await primitive.release()
        replica.pause()
        try:
            for primitive in (permits, rw.read(), rw.write()):
                assert not await primitive.acquire(blocking=False), f"{primitive} counted a yes without its replica"
                assert primitive.outcomes[0].vote is Vote.TIMEOUT, primitive.outcomes
        finally:
            replica.resume()
        # Nothing held is left behind by the failed acquires (their cleanup ran behind the WAITs).
        assert await eventually(lambda: not _held_keys(master), within=10.0), _held_keys(master)


def _held_keys(master: Any) -> list[bytes]:
    """The keys on *master* that hold a permit, a reader or a writer (the lines and limits aside)."""
    found: Any = master.command("KEYS", "*wr:*")
    return [key for key in found if b"limit" not in key and b"queue" not in key and b"waits" not in key]


async def _fails_cleanly(redlock: Redlock, master: Any, key: str = KEY, name: str = "wr") -> None:
    """With the master's replica stopped: a non-blocking acquire fails (its vote a timeout) and leaves no key."""
    lock = redlock.lock(name)
    assert not await lock.acquire(blocking=False), "a yes counted without its replica"
    assert lock.outcomes[0].vote is Vote.TIMEOUT, lock.outcomes
    # The write ran on the master; the failed acquire's cleanup (queued behind the WAIT) removes it.
    assert await eventually(lambda: master.command("EXISTS", key) == 0, within=10.0), "a key was left behind"


def replica_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "replica" in r.getMessage()]


async def test_a_master_with_the_replicas_asked_for_is_not_warned_of_them(
    pair: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    # wait_replicas=1 asks for the replica the master has: no warning that it has one (before: "this master has
    # 1 connected replica(s) ... a Redlock voter should be a master without failover").
    async with Redlock([pair.urls[0]], wait_replicas=1) as redlock:
        await redlock.connect()
    assert replica_warnings(caplog) == []
    # Without the setting, a master with a replica is warned of, as ever.
    async with Redlock([pair.urls[0]]) as redlock:
        await redlock.connect()
    (told,) = replica_warnings(caplog)
    assert "1 connected replica(s)" in told, told


async def test_a_master_with_fewer_replicas_than_asked_for_is_warned_that_its_yes_fails(
    pair: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    master = pair.nodes[0]
    async with Redlock([pair.urls[0]], wait_replicas=2) as redlock:
        await redlock.connect()
        (told,) = replica_warnings(caplog)
        assert f"127.0.0.1:{master.port}" in told, told
        assert "1 connected replica(s), fewer than wait_replicas=2" in told, told
        assert "every yes of it fails" in told, told
        lock = redlock.lock("wr")
        assert not await lock.acquire(blocking=False)  # as it said
        assert lock.outcomes[0].vote is Vote.TIMEOUT, lock.outcomes


# -- a Cluster voter and a Sentinel voter -----------------------------------------------------------------


@pytest.mark.slow
async def test_a_cluster_voter_waits_on_the_shard_primary_that_took_the_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with LocalCluster(2, 1) as cluster:
        mark_shards(cluster)
        async with Redlock([cluster.url], wait_replicas=1, ttl=5.0) as redlock:
            await redlock.connect()
            names = {cluster.shard_of_slot(slot_of(cluster, f"redlock:c{i}")): f"c{i}" for i in range(40)}
            assert set(names) == {0, 1}
            for shard, name in sorted(names.items()):
                master, replica = cluster.master_of(shard), cluster.replicas_of(shard)[0]
                master.command("CONFIG", "RESETSTAT")
                lock = redlock.lock(name)
                assert await lock.acquire(blocking=False), lock.outcomes
                assert waits(master) >= 1, "no WAIT on the primary that took the write"
                assert has(replica, f"redlock:{name}")
                await lock.release()
            # Shard 0's replica stopped: names on shard 0 fail cleanly, names on shard 1 still win.
            master = cluster.master_of(0)
            replica = cluster.replicas_of(0)[0]
            replica.pause()
            try:
                await _fails_cleanly(redlock, master, f"redlock:{names[0]}", names[0])
                other = redlock.lock(names[1])
                assert await other.acquire(blocking=False), other.outcomes
                await other.release()
            finally:
                replica.resume()
        # Every shard primary has one replica: wait_replicas=2 makes each say that its yes fails.
        caplog.clear()
        async with Redlock([cluster.url], wait_replicas=2) as redlock:
            await redlock.connect()
        told = replica_warnings(caplog)
        for shard in (0, 1):
            port = cluster.master_of(shard).port
            assert any(f"127.0.0.1:{port}" in t and "fewer than wait_replicas=2" in t for t in told), told


@pytest.mark.slow
async def test_a_sentinel_voter_waits_for_the_master_s_replica() -> None:
    with LocalSentinels(1, 3) as group:
        async with Redlock([group.url], wait_replicas=1, ttl=5.0) as redlock:
            await redlock.connect()
            master = group.master()
            replica = next(node for node in group.servers if node is not master)
            lock = redlock.lock("wr")
            assert await lock.acquire(blocking=False), lock.outcomes
            assert replica.command("GET", KEY) is not None
            await lock.release()
            replica.pause()
            try:
                await _fails_cleanly(redlock, master)
            finally:
                replica.resume()


@pytest.mark.slow
async def test_a_vote_redirected_by_ask_waits_on_the_importing_primary() -> None:
    # A slot migrating from shard 0's primary to shard 1's: a vote for a name not on the source yet is
    # answered ASK, and goes to the importing primary behind ASKING; its yes counts only with that
    # primary's replica behind it, as every other vote's does.
    with LocalCluster(2, 1) as cluster:
        mark_shards(cluster)
        name = next(f"a{i}" for i in range(100) if cluster.shard_of_slot(slot_of(cluster, f"redlock:a{i}")) == 0)
        key, slot = f"redlock:{name}", slot_of(cluster, f"redlock:{name}")
        source, target = cluster.master_of(0), cluster.master_of(1)
        replica = cluster.replicas_of(1)[0]
        async with Redlock([cluster.url], wait_replicas=1, ttl=5.0) as redlock:
            await redlock.connect()
            target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
            source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
            try:
                lock = redlock.lock(name)
                target.command("CONFIG", "RESETSTAT")
                assert await lock.acquire(blocking=False), lock.outcomes
                # Taken by the importing primary (ASK followed), and waited for there.
                assert target.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
                assert source.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
                assert waits(target) >= 1, "the vote sent behind ASKING had no WAIT"
                assert has(replica, key)
                await lock.extend()  # the key is on the importing primary: the extension is ASKed there too
                replica.pause()
                try:
                    with pytest.raises(LockLost):
                        await lock.extend()
                    await lock.release()  # (lost: its key removed, if it is still there)
                    assert await eventually(
                        lambda: target.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, within=10.0
                    )
                    other = redlock.lock(name)
                    assert not await other.acquire(blocking=False), "a yes behind ASK counted without its replica"
                    assert other.outcomes[0].vote is Vote.TIMEOUT, other.outcomes
                    # The write ran on the importing primary; the failed acquire's cleanup (ASKed there) removes it.
                    assert await eventually(
                        lambda: target.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, within=10.0
                    ), "a key was left behind on the importing primary"
                finally:
                    replica.resume()
            finally:
                for node in (source, target):
                    node.command("CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(source))
                cluster.wait_ready()
