"""A Redis/Valkey Cluster as one voter (``redis+cluster://``), on real cluster-mode servers (LocalCluster):
every lock operation, slot routing, ``MOVED`` after a slot migrated, ``ASK`` during a migration.

One cluster voter (3 shards, a replica each) beside 2 standalone voters: three clusters of six processes
each are too heavy for the 2-core CI box. A standalone voter is paused where a test needs the cluster's
vote to make the majority (a bare majority: the cluster voter's yes decides)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async._health._markers import marker_value
from redlock_async._nodes import tag_for
from redlock_async.cli._codes import EXIT_HELD
from redlock_async.testing import LocalCluster, LocalNodes
from redlock_async.testing._inside import cluster_of
from tests.conftest import mark_in_service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shards() -> Iterator[LocalCluster]:
    with LocalCluster(3, 1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def plain() -> Iterator[LocalNodes]:
    with LocalNodes(2) as nodes:
        yield nodes


IN_SERVICE = 3600.0
"""The period the markers of these tests' voters are written under: longer than any test's, so all trust them."""


def mark_shards(cluster: LocalCluster, period: float = IN_SERVICE) -> None:
    """Write on each shard primary the marker a client leaves on a shard it judged in service (a Cluster
    voter in service has them; without, beside standalone voters in service, its shards sit out a period)."""
    for shard in range(len(cluster.shards)):
        master = cluster.master_of(shard)
        lowest = min(first for first, _ in _ranges(master, master))
        server: Any = master.command("INFO", "server")
        replication: Any = master.command("INFO", "replication")
        identity = f"{server['run_id']}.{replication['master_replid']}".encode()
        master.command("SET", b"redlock:" + tag_for(lowest), marker_value(identity, period))


def ready_voters(shards: LocalCluster, plain: LocalNodes) -> list[str]:
    """The cluster voter first, then the standalone ones; every node resumed, flushed and marked in service."""
    for node in plain.nodes:
        node.resume()
    plain.flush()
    for node in plain.nodes:
        mark_in_service(node, period=IN_SERVICE)
    shards.flush()
    mark_shards(shards)
    return [shards.url, *plain.urls]


@pytest.fixture
def voters(shards: LocalCluster, plain: LocalNodes) -> list[str]:
    return ready_voters(shards, plain)


@pytest.fixture
async def redlock(voters: list[str]) -> AsyncIterator[Redlock]:
    async with Redlock(voters, queue=False) as redlock:
        yield redlock


def owner_of_key(shards: LocalCluster, key: str) -> Any:
    slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
    for shard in range(len(shards.shards)):
        master = shards.master_of(shard)
        if any(first <= slot <= last for first, last in _ranges(master, master)):
            return master
    raise AssertionError(f"no master serves slot {slot}")


def _ranges(asked: Any, master: Any) -> list[tuple[int, int]]:
    ranges = []
    for entry in asked.command("CLUSTER", "SLOTS"):
        if int(entry[2][1]) == master.port:
            ranges.append((int(entry[0]), int(entry[1])))
    return ranges


def voter_of(redlock: Redlock) -> Any:
    return cluster_of(redlock).nodes[0]


async def test_every_lock_operation_on_a_cluster_voter_with_the_cluster_deciding(
    redlock: Redlock, shards: LocalCluster, plain: LocalNodes
) -> None:
    plain.nodes[1].pause()  # a bare majority: the cluster voter's yes decides every round
    names = [f"orders:{i}" for i in range(12)]
    for name in names:
        lock = redlock.lock(name, ttl=5.0)
        assert await lock.acquire(blocking=False), lock.outcomes
        key = f"redlock:{name}"
        # On the primary of the key's slot (not on another shard), with the lock's token.
        assert owner_of_key(shards, key).command("GET", key) is not None
        await lock.extend()
        ttl = int(owner_of_key(shards, key).command("PTTL", key))
        assert 2500 < ttl <= 5000  # extended: a full ttl again (less what a loaded box took meanwhile)
        await lock.release()
        assert owner_of_key(shards, key).command("GET", key) is None
    # Several shards served them.
    served = {owner_of_key(shards, f"redlock:{name}").port for name in names}
    assert len(served) == 3


async def test_async_with_and_the_watchdog_keep_a_lock_on_a_cluster_voter(
    redlock: Redlock, shards: LocalCluster, plain: LocalNodes
) -> None:
    plain.nodes[1].pause()
    lock = redlock.lock("watched", ttl=2.0)
    async with lock:
        await asyncio.sleep(5.0)  # two ttls and a half: only the watchdog's extensions keep it
        assert lock.held
        assert owner_of_key(shards, "redlock:watched").command("GET", "redlock:watched") is not None
    assert owner_of_key(shards, "redlock:watched").command("GET", "redlock:watched") is None
    other = redlock.lock("watched")
    assert await other.acquire(blocking=False)
    await other.release()


async def test_a_second_client_is_refused_while_the_cluster_voter_holds(voters: list[str], plain: LocalNodes) -> None:
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False) as second:
        mine = first.lock("contended", ttl=5.0)
        assert await mine.acquire(blocking=False)
        plain.nodes[0].pause()  # the second client could win only by the cluster voter's word
        theirs = second.lock("contended", ttl=5.0)
        assert not await theirs.acquire(blocking=False)
        plain.nodes[0].resume()
        await mine.release()


async def test_moved_after_a_slot_migrated_reroutes_and_updates_the_map(
    redlock: Redlock, shards: LocalCluster, plain: LocalNodes
) -> None:
    plain.nodes[1].pause()
    name, key = "migrating", "redlock:migrating"
    lock = redlock.lock(name, ttl=5.0)
    assert await lock.acquire(blocking=False)
    await lock.release()
    voter = voter_of(redlock)
    slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
    source = owner_of_key(shards, key)
    target = next(shards.master_of(s) for s in range(3) if shards.master_of(s) is not source)
    refreshes = voter.refreshes
    migrate(shards, slot, source, target)
    assert voter.owners[slot].endpoint.port == source.port  # the map has not heard yet
    assert await lock.acquire(blocking=False), lock.outcomes
    assert target.command("GET", key) is not None  # MOVED followed: the key is on the new owner
    assert voter.owners[slot].endpoint.port == target.port
    await lock.release()
    assert target.command("GET", key) is None
    assert voter.refreshes > refreshes or voter.owners[slot].endpoint.port == target.port
    migrate(shards, slot, target, source)


async def test_ask_during_a_migration_is_followed_once_with_asking(
    redlock: Redlock, shards: LocalCluster, plain: LocalNodes
) -> None:
    plain.nodes[1].pause()
    name, key = "asked", "redlock:asked"
    slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
    source = owner_of_key(shards, key)
    target = next(shards.master_of(s) for s in range(3) if shards.master_of(s) is not source)
    lock = redlock.lock(name, ttl=5.0)
    assert await lock.acquire(blocking=False)  # the map is read; the slot is source's
    await lock.release()
    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", shards.node_id(source))
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", shards.node_id(target))
    try:
        # The key is not on the source: it answers ASK, and the acquire is taken by the target.
        assert await lock.acquire(blocking=False), lock.outcomes
        # (Read as counts: an importing node answers MOVED to a plain GET of the slot.)
        assert target.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
        assert source.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert voter_of(redlock).owners[slot].endpoint.port == source.port  # ASK moves no slot
        await lock.release()
        assert target.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        for node in (source, target):
            node.command("CLUSTER", "SETSLOT", slot, "NODE", shards.node_id(source))
        shards.wait_ready()


def migrate(shards: LocalCluster, slot: int, source: Any, target: Any) -> None:
    """Move *slot* from *source* to *target* by hand, as ``valkey-cli --cluster reshard`` does."""
    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", shards.node_id(source))
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", shards.node_id(target))
    while keys := source.command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    for node in (target, source):
        node.command("CLUSTER", "SETSLOT", slot, "NODE", shards.node_id(target))
    for shard in range(len(shards.shards)):
        master = shards.master_of(shard)
        if master not in (source, target):
            master.command("CLUSTER", "SETSLOT", slot, "NODE", shards.node_id(target))
    shards.wait_ready()


async def test_tryagain_during_a_migration_counts_as_the_voters_timeout(redlock: Redlock, shards: LocalCluster) -> None:
    # Two keys of one slot (one hash tag), one of them moved already: the source cannot serve both.
    first, second = b"redlock:{split}a", b"redlock:{split}b"
    slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", first))  # type: ignore[call-overload]
    source = owner_of_key(shards, first.decode())
    target = next(shards.master_of(s) for s in range(3) if shards.master_of(s) is not source)
    voter = voter_of(redlock)
    await voter.refresh()
    source.command("SET", first, "1")
    source.command("SET", second, "2")
    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", shards.node_id(source))
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", shards.node_id(target))
    try:
        source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", second)
        reply = await voter.send(b"MGET", first, second)
        assert reply.vote.value == "timeout", reply
        assert "TRYAGAIN" in reply.detail
    finally:
        for node in (source, target):
            node.command("CLUSTER", "SETSLOT", slot, "NODE", shards.node_id(source))
        shards.wait_ready()


async def test_a_waiter_hears_the_release_on_a_cluster_voter(voters: list[str], plain: LocalNodes) -> None:
    # The waiter retries only after 60 s, past its acquire timeout: it wins only if it hears the release.
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False, retry_delay=60.0) as second:
        plain.nodes[1].pause()  # the release words of the cluster voter are needed for a majority
        mine = first.lock("handed", ttl=30.0)
        assert await mine.acquire(blocking=False)
        waiter = asyncio.ensure_future(second.lock("handed", ttl=30.0, acquire_timeout=20.0).acquire())
        await asyncio.sleep(1.0)
        await mine.release()
        assert await asyncio.wait_for(waiter, 15.0)  # before any retry: woken by the release word
        assert second.statistics().wakeups >= 1


def test_the_blocking_api_takes_a_cluster_voter(voters: list[str], plain: LocalNodes, shards: LocalCluster) -> None:
    from redlock_async.sync import Redlock as BlockingRedlock

    plain.nodes[1].pause()
    with BlockingRedlock(voters, queue=False) as redlock, redlock.lock("blocking", ttl=5.0) as lock:
        assert lock.held
        assert owner_of_key(shards, "redlock:blocking").command("GET", "redlock:blocking") is not None


async def test_redlock_status_reads_a_cluster_voter_from_redlock_nodes(redlock: Redlock, voters: list[str]) -> None:
    env = {**os.environ, "REDLOCK_NODES": ",".join(voters)}

    async def status() -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "redlock_async", "status", "looked-at",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode or 0, out.decode() + err.decode()

    code, out = await status()
    assert code == 0, out
    assert "verdict: free (3 of 3 nodes answered" in out
    async with redlock.lock("looked-at", ttl=30.0):
        code, out = await status()
    assert code == EXIT_HELD, out
    assert "verdict: held by" in out
    assert "on 3 of 3 nodes" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("cluster:"))
    assert "held by" in line, out
    assert "quarantined" not in line, out


async def test_queue_fencing_semaphore_and_rw_lock_on_a_cluster_voter_when_a_names_keys_share_a_slot(
    voters: list[str], shards: LocalCluster, plain: LocalNodes
) -> None:
    # A name holding a hash tag puts every key of it in one slot (the fence counter, the line, the
    # permits, the readers): what the scripts of these primitives need on a Cluster.
    async with Redlock(voters) as first, Redlock(voters) as second:
        plain.nodes[1].pause()  # the cluster voter's word decides
        mine = first.lock("{queued}", ttl=10.0, fencing=True)
        assert await mine.acquire(blocking=False), mine.outcomes
        token = mine.fencing_token
        assert token is not None
        assert owner_of_key(shards, "redlock:{queued}").command("GET", "redlock:{queued}") is not None
        waiter = second.lock("{queued}", ttl=10.0, fencing=True, acquire_timeout=20.0)
        waiting = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.5)
        await mine.release()
        assert await asyncio.wait_for(waiting, 20.0)  # handed over through the line, on the cluster voter too
        assert waiter.fencing_token is not None
        assert waiter.fencing_token > token
        await waiter.release()

        one, two = first.semaphore("{permits}", limit=2), second.semaphore("{permits}", limit=2)
        assert await one.acquire(blocking=False)
        assert await two.acquire(blocking=False)
        assert not await first.semaphore("{permits}", limit=2).acquire(blocking=False)
        await one.release()
        await two.release()

        rw = first.rw_lock("{shelf}")
        reading = rw.read()
        assert await reading.acquire(blocking=False)
        assert not await second.rw_lock("{shelf}").write().acquire(blocking=False)
        await reading.release()
        writing = second.rw_lock("{shelf}").write()
        assert await writing.acquire(blocking=False)
        await writing.release()


async def test_several_keys_in_several_slots_are_refused_in_words(voters: list[str], plain: LocalNodes) -> None:
    async with Redlock(voters, queue=False) as redlock:
        plain.nodes[1].pause()
        lock = redlock.lock_many(["no-tag", "other"], ttl=5.0)  # two names: two slots, by nature
        assert not await lock.acquire(blocking=False)
        detail = lock.outcomes[0].detail
        assert "CROSSSLOT" in detail
        assert "one slot" in detail


async def test_a_fenced_lock_and_a_rw_lock_of_any_name_on_a_cluster_voter(voters: list[str], plain: LocalNodes) -> None:
    """With a cluster voter, a fencing counter and a read/write lock's companions are in the slot of the key
    they serve (docs/algorithm.md, "One cluster slot per name"): names without a hash tag, or whose braces
    make none, are fenced, queued and read/write locked there too (before: CROSSSLOT)."""
    async with Redlock(voters, fencing=True) as first, Redlock(voters, fencing=True) as second:
        plain.nodes[1].pause()  # the cluster voter's vote decides
        for name in ("no-tag", "a{}b", "a{b"):
            mine = first.lock(name, ttl=10.0)
            assert await mine.acquire(blocking=False), mine.outcomes
            token = mine.fencing_token
            assert token is not None
            waiter = second.lock(name, ttl=10.0, acquire_timeout=20.0)
            waiting = asyncio.ensure_future(waiter.acquire())
            await asyncio.sleep(0.3)
            await mine.release()
            assert await asyncio.wait_for(waiting, 20.0)  # handed over through the line, fenced
            assert waiter.fencing_token is not None
            assert waiter.fencing_token > token
            await waiter.release()
            reading = first.rw_lock(name).read()
            assert await reading.acquire(blocking=False), reading.outcomes
            assert not await second.rw_lock(name).write().acquire(blocking=False)
            await reading.release()
            writing = second.rw_lock(name).write()
            assert await writing.acquire(blocking=False), writing.outcomes
            assert writing.fencing_token is not None
            await writing.release()


async def test_the_default_lock_and_a_semaphore_of_a_plain_name_on_a_cluster_voter(
    voters: list[str], plain: LocalNodes
) -> None:
    """What most users write, `async with redlock.lock(name)` at the defaults (grant queue, listening marks),
    and a semaphore, with a plain name, where the cluster voter's vote decides."""
    async with Redlock(voters) as first, Redlock(voters) as second:
        plain.nodes[1].pause()
        async with first.lock("jobs:nightly", ttl=10.0) as held:
            assert held.held
            assert not await second.lock("jobs:nightly").acquire(blocking=False)
        async with second.lock("jobs:nightly", ttl=10.0) as again:  # released: free again at once
            assert again.held
        permits = [first.semaphore("pool", limit=2), second.semaphore("pool", limit=2)]
        for permit in permits:
            assert await permit.acquire(blocking=False), permit.outcomes
        assert not await first.semaphore("pool", limit=2).acquire(blocking=False)
        for permit in permits:
            await permit.release()


async def test_three_cluster_voters_acquire_extend_release_and_watch() -> None:
    # Three Clusters of two shards each, no replicas (six processes): every voter is a Cluster.
    with LocalCluster(2, 0) as one, LocalCluster(2, 0) as two, LocalCluster(2, 0) as three:
        clusters = [one, two, three]
        # (A wider node_timeout: six processes just started share the 2-core box with the other tests.)
        async with Redlock([cluster.url for cluster in clusters], queue=False, node_timeout=0.3) as redlock:
            for name in ("alpha", "beta", "gamma", "delta"):
                key = f"redlock:{name}"
                lock = redlock.lock(name, ttl=5.0)
                assert await lock.acquire(blocking=False), lock.outcomes
                assert all(owner_of_key(cluster, key).command("GET", key) is not None for cluster in clusters)
                await lock.extend()
                await lock.release()
                assert all(owner_of_key(cluster, key).command("GET", key) is None for cluster in clusters)
            watched = redlock.lock("watched", ttl=3.0)
            async with watched:
                await asyncio.sleep(7.0)
                assert watched.held
            paused = clusters[2].master_of(0)
            paused.pause()  # a shard down: the other two voters still make the majority
            try:
                for name in ("alpha", "beta", "gamma", "delta"):
                    lock = redlock.lock(name, ttl=5.0)
                    assert await lock.acquire(blocking=False), lock.outcomes
                    await lock.release()
            finally:
                paused.resume()


async def test_a_cluster_voter_with_a_password_and_one_without_it(plain: LocalNodes, voters: list[str]) -> None:
    with LocalCluster(2, 0, password="s3cret") as guarded:
        mark_shards(guarded)
        seeds = "&".join(f"seed=127.0.0.1:{node.port}" for node in guarded.nodes[1:])
        first = guarded.nodes[0].port
        url = f"redis+cluster://:s3cret@127.0.0.1:{first}?{seeds}"
        plain.nodes[1].pause()
        async with Redlock([url, *voters[1:]], queue=False) as redlock:
            lock = redlock.lock("guarded", ttl=5.0)
            assert await lock.acquire(blocking=False), lock.outcomes
            await lock.release()
        wrong = f"redis+cluster://:wrong@127.0.0.1:{first}?{seeds}"
        async with Redlock([wrong, *voters[1:]], queue=False) as refused:
            lock = refused.lock("guarded", ttl=5.0)
            assert not await lock.acquire(blocking=False)
            assert "AUTH" in lock.outcomes[0].detail, lock.outcomes
            assert "wrong" not in lock.outcomes[0].detail


async def test_clusterdown_counts_as_the_voters_timeout(plain: LocalNodes, voters: list[str]) -> None:
    with LocalCluster(1, 0) as lone:
        node = lone.nodes[0]
        async with Redlock([lone.url, *voters[1:]], queue=False) as redlock:
            voter = voter_of(redlock)
            assert await voter.connect() is None
            slot = int(node.command("CLUSTER", "KEYSLOT", "redlock:down"))  # type: ignore[call-overload]
            node.command("CLUSTER", "DELSLOTS", slot)  # a slot served by no one: the cluster is down
            try:
                for _ in range(100):
                    if b"cluster_state:fail" in node.command("CLUSTER", "INFO"):  # type: ignore[operator]
                        break
                    await asyncio.sleep(0.1)
                reply = await voter.send(b"GET", b"redlock:down")
                assert reply.vote.value == "timeout", reply
                assert "CLUSTERDOWN" in reply.detail
            finally:
                node.command("CLUSTER", "ADDSLOTS", slot)


async def test_one_cluster_voter_alone(shards: LocalCluster, voters: list[str]) -> None:
    async with Redlock([shards.url], queue=False) as redlock, Redlock([shards.url], queue=False) as other:
        lock = redlock.lock("alone", ttl=5.0)
        assert await lock.acquire(blocking=False), lock.outcomes
        assert not await other.lock("alone", ttl=5.0).acquire(blocking=False)
        await lock.release()
        assert await other.lock("alone", ttl=5.0).acquire(blocking=False)


async def test_redlock_break_clears_a_cluster_voter(redlock: Redlock, voters: list[str], shards: LocalCluster) -> None:
    name, key = "{stuck}", "redlock:{stuck}"
    lock = redlock.lock(name, ttl=60.0)
    assert await lock.acquire(blocking=False), lock.outcomes
    assert owner_of_key(shards, key).command("GET", key) is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "redlock_async", "break", name, "--yes", "--nodes", ",".join(voters),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, out.decode() + err.decode()
    assert "broken: 3 of 3 nodes are clear" in out.decode()
    assert owner_of_key(shards, key).command("GET", key) is None
