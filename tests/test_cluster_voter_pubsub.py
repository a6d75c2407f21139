"""Hand-off words on a Cluster voter go by sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``), on real cluster-mode
servers (LocalCluster): a waiter woken by the word, not by its retry (a retry_delay past its acquire timeout);
the word carried only by the primary that serves the name's slot; a waiter whose slot migrates while it waits
is still woken; a waiter whose shard fails over is subscribed again on the promoted replica; standalone voters
keep plain ``PUBLISH``.

One cluster voter (3 shards, a replica each: a shard fails over last) beside 2 standalone voters, one of them
paused: the cluster voter's word is needed for a majority of words, and its yes for a majority of votes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redlock_async import Redlock
from redlock_async._nodes import Fallback, pack, pack_script
from redlock_async._nodes._cluster_scripts import TWINS, scripted, sharded, sharded_publish
from redlock_async._nodes._cluster_scripts import for_shard as swap
from redlock_async._nodes._slots import routing_key
from redlock_async._queue import queue_keys
from redlock_async._scripts import HANDED_RELEASE, PERMISSIONS, QUEUE_LEAVE, QUEUE_LEAVE_NATIVE, RELEASE, SCRIPTS
from redlock_async.testing import LocalCluster, LocalNodes
from redlock_async.testing._inside import cluster_of
from tests.test_cluster_voter import migrate, owner_of_key, ready_voters

pytestmark = pytest.mark.slow

WAIT_LONGER = 60.0
"""The waiters' retry_delay: past their acquire timeout, so only a word wakes them in time."""


@pytest.fixture(scope="module")
def shards() -> Iterator[LocalCluster]:
    with LocalCluster(3, 1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def plain() -> Iterator[LocalNodes]:
    with LocalNodes(2) as nodes:
        yield nodes


@pytest.fixture
def voters(shards: LocalCluster, plain: LocalNodes) -> Iterator[list[str]]:
    urls = ready_voters(shards, plain)
    plain.nodes[1].pause()  # the cluster voter's word and vote decide
    yield urls
    plain.nodes[1].resume()


def shard_subscribers(node: Any, channel: str) -> int:
    reply: Any = node.command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


def plain_subscribers(node: Any, channel: str) -> int:
    reply: Any = node.command("PUBSUB", "NUMSUB", channel)
    return int(reply[1])


async def until(what: str, done: Any, limit: float = 30.0) -> None:
    """Wait (polling) until *done()*; fail saying *what* after *limit* seconds (a bound, not a timing claim)."""
    for _ in range(int(limit / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {limit} s: {what}")


def parked(redlock: Redlock, key: str) -> bool:
    """True when a waiter of *redlock* for *key* waits for a word now (not between two of its looks): a release
    then can reach it only by its word, or by its retry."""
    return cluster_of(redlock).listener.parked(key.encode())


class Heard:
    """A plain ``SUBSCRIBE`` on one cluster node, in a thread: what it hears (a ``PUBLISH`` anywhere in the
    Cluster reaches it; an ``SPUBLISH`` never does)."""

    def __init__(self, port: int, channel: str) -> None:
        self.pubsub = redis.Redis(port=port).pubsub()  # type: ignore[no-untyped-call]
        self.pubsub.subscribe(channel)
        self.messages: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                self.messages.append(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pubsub.close()


@pytest.mark.parametrize("queue", [False, True], ids=["plain", "queue"])
async def test_a_waiter_is_woken_by_a_word_carried_only_by_the_shard_of_its_name(
    voters: list[str], shards: LocalCluster, plain: LocalNodes, queue: bool
) -> None:
    name = f"sharded-{queue}"
    key = f"redlock:{name}"
    owner = owner_of_key(shards, key)
    others = [shards.master_of(s) for s in range(3) if shards.master_of(s) is not owner]
    elsewhere = Heard(others[0].port, key)  # would hear a plain PUBLISH of the word
    try:
        async with (
            Redlock(voters, queue=queue) as first,
            Redlock(voters, queue=queue, retry_delay=WAIT_LONGER) as second,
        ):
            mine = first.lock(name, ttl=30.0)
            assert await mine.acquire(blocking=False), mine.outcomes
            waiter = asyncio.ensure_future(second.lock(name, ttl=30.0, acquire_timeout=20.0).acquire())
            # The waiter listens on the owning primary, by sharded pub/sub, and nowhere else.
            await until("the waiter's SSUBSCRIBE on the owner", lambda: shard_subscribers(owner, key) == 1)
            assert [shard_subscribers(node, key) for node in others] == [0, 0]
            assert [plain_subscribers(node, key) for node in (owner, *others)] == [0, 1, 0]  # (the 1: ours)
            if queue:  # in the owner's line: the release grants it the key, and a grant word tells it
                line = queue_keys(key.encode())[1]
                for node in (owner, plain.nodes[0]):
                    await until("the waiter in line", lambda node=node: node.command("EXISTS", line) == 1)
            else:
                await until("the waiter parked", lambda: parked(second, key))
            await mine.release()
            assert await asyncio.wait_for(waiter, 15.0)  # before any retry: woken by the word
            # (In line, a grant word heard while its entry's try still waits for the paused node's answer is
            # counted as that try's win, not as a wake-up.)
            assert queue or second.statistics().wakeups >= 1
        assert elsewhere.messages == []  # no word went to the Cluster's other nodes
    finally:
        elsewhere.close()
    assert shard_subscribers(owner, key) == 0  # left (SUNSUBSCRIBE) when the Redlock closed


async def test_a_waiter_whose_slot_migrates_while_it_waits_is_still_woken(
    voters: list[str], shards: LocalCluster
) -> None:
    name, key = "migrating-waiter", "redlock:migrating-waiter"
    slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
    source = owner_of_key(shards, key)
    target = next(shards.master_of(s) for s in range(3) if shards.master_of(s) is not source)
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False, retry_delay=WAIT_LONGER) as second:
        mine = first.lock(name, ttl=30.0)
        assert await mine.acquire(blocking=False), mine.outcomes
        waiter = asyncio.ensure_future(second.lock(name, ttl=30.0, acquire_timeout=25.0).acquire())
        await until("the waiter's SSUBSCRIBE on the source", lambda: shard_subscribers(source, key) == 1)
        migrate(shards, slot, source, target)  # the key with it; the source drops the subscription (sunsubscribe)
        try:
            await until("the waiter subscribed again on the target", lambda: shard_subscribers(target, key) == 1)
            assert shard_subscribers(source, key) == 0
            assert target.command("GET", key) is not None
            await until("the waiter parked", lambda: parked(second, key))
            await mine.release()  # MOVED, then released on the target, whose SPUBLISH the waiter hears
            assert await asyncio.wait_for(waiter, 15.0)
            assert second.statistics().wakeups >= 1
        finally:
            waiter.cancel()
            migrate(shards, slot, target, source)


async def test_standalone_voters_keep_plain_publish(plain: LocalNodes, shards: LocalCluster) -> None:
    for node in plain.nodes:
        node.resume()
    plain.flush()
    async with (
        Redlock(plain.urls, queue=False) as first,
        Redlock(plain.urls, queue=False, retry_delay=WAIT_LONGER) as second,
    ):
        mine = first.lock("standalone", ttl=30.0)
        assert await mine.acquire(blocking=False)
        waiter = asyncio.ensure_future(second.lock("standalone", ttl=30.0, acquire_timeout=20.0).acquire())
        node = plain.nodes[0]
        await until("the waiter's SUBSCRIBE", lambda: plain_subscribers(node, "redlock:standalone") == 1)
        assert shard_subscribers(node, "redlock:standalone") == 0
        await until("the waiter parked", lambda: parked(second, "redlock:standalone"))
        await mine.release()
        assert await asyncio.wait_for(waiter, 15.0)


async def test_a_cluster_voters_subscriber_follows_moved_to_the_owner(voters: list[str], shards: LocalCluster) -> None:
    async with Redlock(voters, queue=False) as redlock:
        await redlock.connect()
        subscriber = cluster_of(redlock).listener.nodes[0]
        key = b"redlock:moved-subscription"
        owner = owner_of_key(shards, key.decode())
        wrong = next(shards.master_of(s) for s in range(3) if shards.master_of(s) is not owner)
        voter: Any = cluster_of(redlock).nodes[0]
        slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
        right = voter.owners[slot]
        voter.owners[slot] = next(shard for shard in voter.primaries() if shard.endpoint.port == wrong.port)
        try:
            reply = await subscriber.send(b"SUBSCRIBE", key)  # to the wrong primary: MOVED, then the owner
        finally:
            voter.owners[slot] = right
        assert reply[0] == b"subscribe", reply
        assert shard_subscribers(owner, key.decode()) == 1
        assert shard_subscribers(wrong, key.decode()) == 0
        await subscriber.send(b"UNSUBSCRIBE", key)
        await until("SUNSUBSCRIBE", lambda: shard_subscribers(owner, key.decode()) == 0)


def as_shard(packed: bytes, fallback: Fallback, sharded: bool, native: bool) -> tuple[bytes, Fallback]:
    """*packed* as a shard primary runs it (its digest found as the Cluster voter finds it)."""
    digest = routing_key(packed)[1]
    return swap(packed, digest, fallback, sharded, native) if digest else (packed, fallback)


def test_every_publishing_script_has_a_sharded_twin_and_only_the_digest_changes() -> None:
    published = [script for script in SCRIPTS if b"PUBLISH" in script.source]
    assert RELEASE in published
    for script in (*published, PERMISSIONS):
        twin = sharded(script)
        assert twin is not script
        assert TWINS[script.sha] == twin
        assert b"'PUBLISH'" not in twin.source
        assert b"'SPUBLISH'" in twin.source
        assert twin.creates == script.creates
    keys, args = (b"redlock:x", b"redlock:x\x00listening{x}"), (b"token", 7)
    packed = pack_script(RELEASE, keys, args)
    swapped, fallback = as_shard(packed, (RELEASE, keys, args), True, False)
    assert swapped == pack_script(sharded(RELEASE), keys, args)
    assert fallback == (sharded(RELEASE), keys, args)
    assert as_shard(packed, None, False, True) == (packed, None)  # plain pub/sub (CLUSTER SLOTS): as it is
    # A lock's release on a primary whose connection may run DELIFEQ: the native one, in its sharded form; and
    # back (a MOVED to a primary that may not).
    leave = pack_script(QUEUE_LEAVE, keys, args)
    native, fallback = as_shard(leave, (QUEUE_LEAVE, keys, args), True, True)
    assert native == pack_script(sharded(QUEUE_LEAVE_NATIVE), keys, args)
    assert fallback == (sharded(QUEUE_LEAVE_NATIVE), keys, args)
    assert as_shard(native, fallback, True, False) == (
        pack_script(sharded(QUEUE_LEAVE), keys, args),
        (sharded(QUEUE_LEAVE), keys, args),
    )
    assert as_shard(native, None, False, False)[0] == leave
    # A hand-over's release: DELIFEQ itself where the primary may run it (no fallback: no script), and back.
    handed = pack_script(HANDED_RELEASE, keys[:1], (b"token",))
    assert as_shard(handed, (HANDED_RELEASE, keys[:1], (b"token",)), True, True) == (
        pack((b"DELIFEQ", keys[0], b"token")),
        None,
    )
    assert as_shard(handed, None, True, False) == (handed, None)
    assert scripted(pack((b"DELIFEQ", keys[0], b"token")), keys[0]) == (
        handed,
        (HANDED_RELEASE, keys[:1], (b"token",)),
    )
    # A word said alone (a give-back's release word, a leader's announcement) goes by SPUBLISH too.
    assert sharded_publish(pack((b"PUBLISH", b"redlock:x", b"1"))) == pack((b"SPUBLISH", b"redlock:x", b"1"))
    # Anything else goes as it is.
    assert sharded_publish(pack((b"GET", b"k"))) == pack((b"GET", b"k"))
    assert as_shard(pack((b"GET", b"k")), None, True, True) == (pack((b"GET", b"k")), None)
    quiet = next(script for script in SCRIPTS if b"PUBLISH" not in script.source)
    assert sharded(quiet) is quiet
    assert as_shard(pack_script(quiet, keys, args), None, True, True)[0] == pack_script(quiet, keys, args)


async def test_a_waiters_subscription_follows_a_failover_of_its_shard(voters: list[str], shards: LocalCluster) -> None:
    # (Last in this file: the cluster stays failed over.)
    name, key = "failing-over", "redlock:failing-over"
    owner = owner_of_key(shards, key)
    shard = next(s for s in range(3) if shards.master_of(s) is owner)
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False, retry_delay=WAIT_LONGER) as second:
        mine = first.lock(name, ttl=30.0)
        assert await mine.acquire(blocking=False), mine.outcomes
        waiter = asyncio.ensure_future(second.lock(name, ttl=30.0, acquire_timeout=60.0).acquire())
        try:
            await until("the waiter's SSUBSCRIBE on the owner", lambda: shard_subscribers(owner, key) == 1)
            promoted = await asyncio.to_thread(shards.failover, shard)
            assert promoted is not owner
            # The old primary dropped it (its slots left it); the waiter is subscribed where the slot is served now.
            await until("the waiter subscribed on the promoted replica", lambda: shard_subscribers(promoted, key) == 1)
            await until("none left on the old primary", lambda: shard_subscribers(owner, key) == 0)
        finally:
            waiter.cancel()
