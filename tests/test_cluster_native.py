"""The native release on a Cluster voter's shard primaries (issue 39 item 5): each primary's connection asks,
as a standalone node's does, whether the server has ``DELIFEQ`` and the user may run it (on a key under the
prefix in a slot that primary serves), and a lock's release goes as ``QUEUE_LEAVE_NATIVE``'s sharded twin
there, as ``QUEUE_LEAVE``'s elsewhere: a Cluster whose primaries differ mixes the two."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async._nodes import tag_for
from redlock_async._nodes._cluster_voter import ClusterVoter
from redlock_async._nodes._slots import key_slot
from redlock_async._scripts import HANDED_RELEASE
from redlock_async.testing import LocalCluster, LocalNode
from redlock_async.testing._inside import cluster_of
from tests.conftest import assert_no_library_tasks
from tests.test_acl import PASSWORD, documented_rules
from tests.test_cluster_acl import sharded_rules
from tests.test_cluster_voter import mark_shards
from tests.test_native_cas import calls

pytestmark = pytest.mark.slow

PAIRS = 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two shards, no replicas; users: "plain" (the documented ACL line, no +delifeq) everywhere, "native" (the
    same and +delifeq) everywhere, and "mixed": +delifeq on shard 0's primary only."""
    with LocalCluster(2, 0) as cluster:
        if cluster.master_of(0).command("COMMAND", "INFO", "DELIFEQ") in ([None], [], None):
            pytest.skip("the server has no DELIFEQ: every primary takes the scripts (tested everywhere else)")
        rules = documented_rules() + " " + sharded_rules()
        for shard, nodes in enumerate(cluster.shards):
            for node in nodes:
                for user, native in (("plain", False), ("native", True), ("mixed", shard == 0)):
                    line = rules.replace("redlock on", f"{user} on", 1) + (" +delifeq" if native else "")
                    node.command("ACL", "SETUSER", *line.split())
        yield cluster


def names_per_shard(cluster: LocalCluster) -> list[str]:
    """One lock name served by each shard (by its key's slot)."""
    names: list[str] = []
    for shard in range(len(cluster.shards)):
        first, _ = cluster.slot_ranges(shard)
        names.append("native:" + tag_for(first).decode())
        assert cluster.shard_of_slot(key_slot(b"redlock:" + names[-1].encode())) == shard
    return names


def url_as(cluster: LocalCluster, user: str) -> str:
    if user == "default":
        return cluster.url
    return cluster.url.replace("redis+cluster://", f"redis+cluster://{user}:{PASSWORD}@")


def refused(node: LocalNode) -> list[object]:
    """What ``ACL LOG`` says was refused that a release runs (the map's reading sends ``CLUSTER SLOTS`` beside
    ``CLUSTER SHARDS``, which the documented user may not run: logged, and of no matter here)."""
    log = node.command("ACL", "LOG")
    assert isinstance(log, list), log
    return [entry for entry in log if entry.get(b"object") not in (b"cluster|slots",)]


def primaries(cluster: LocalCluster) -> list[LocalNode]:
    return [cluster.master_of(shard) for shard in range(len(cluster.shards))]


@pytest.mark.parametrize(
    ("user", "native"),
    [("default", [True, True]), ("native", [True, True]), ("plain", [False, False]), ("mixed", [True, False])],
)
async def test_each_primary_releases_natively_where_its_connection_may(
    cluster: LocalCluster, user: str, native: list[bool]
) -> None:
    cluster.flush()
    mark_shards(cluster)
    masters = primaries(cluster)
    for node in masters:
        node.command("CONFIG", "RESETSTAT")
        node.command("ACL", "LOG", "RESET")
    names = names_per_shard(cluster)
    async with Redlock([url_as(cluster, user)], ttl=5.0) as redlock:  # the default path: the grant queue
        for name in names:
            lock = redlock.lock(name)
            for _ in range(PAIRS):
                async with lock:
                    assert lock.held
        voter = cluster_of(redlock).nodes[0]
        assert isinstance(voter, ClusterVoter)
        assert [shard.delifeq for shard in voter.primaries()] == native
        assert voter.delifeq is False  # (the voter's own: never asked; each primary's is)
    delifeq = [calls(node, "delifeq") for node in masters]
    # Each release where it may ran DELIFEQ once (in the script); none elsewhere.
    assert [count >= PAIRS for count in delifeq] == native, delifeq
    assert [count == 0 for count in delifeq] == [not one for one in native], delifeq
    for node, name in zip(masters, names, strict=True):
        assert node.command("EXISTS", f"redlock:{name}") == 0  # released, every time, on both paths
        assert refused(node) == []  # the question was asked of the ACL: nothing ran, nothing refused
    assert_no_library_tasks()


async def test_a_release_moved_to_another_primary_runs_as_that_primary_may(cluster: LocalCluster) -> None:
    """A release sent to the primary the map names, which answers MOVED (its slot went to the other one): it is
    sent again as the primary it lands on may run it (the scripts on a primary whose user may not)."""
    cluster.flush()
    mark_shards(cluster)
    masters = primaries(cluster)
    names = names_per_shard(cluster)
    async with Redlock([url_as(cluster, "mixed")], ttl=5.0) as redlock:
        voter = cluster_of(redlock).nodes[0]
        assert isinstance(voter, ClusterVoter)
        owners = voter.owners
        slot = key_slot(f"redlock:{names[1]}".encode())
        lock = redlock.lock(names[1])
        assert await lock.acquire(blocking=False), lock.outcomes
        right = owners[slot]
        wrong = next(shard for shard in voter.shards.values() if shard is not right)
        owners[slot] = wrong  # a stale map: shard 0's primary, whose user may run DELIFEQ
        assert wrong.delifeq
        assert right is not None
        assert not right.delifeq
        for node in masters:
            node.command("CONFIG", "RESETSTAT")
        await lock.release()
        assert owners[slot] is right  # MOVED put the owner back
    assert [calls(node, "delifeq") for node in masters] == [0, 0]  # the wrong one refused it, the right one may not
    assert masters[1].command("EXISTS", f"redlock:{names[1]}") == 0
    assert refused(masters[1]) == []
    assert_no_library_tasks()


@pytest.mark.parametrize(("shard", "native"), [(0, True), (1, False)])
async def test_a_hand_over_releases_with_delifeq_where_the_primary_may(
    cluster: LocalCluster, shard: int, native: bool
) -> None:
    """A hand-over's release (a bare compare-and-delete) is ``DELIFEQ`` itself on a primary whose connection may
    run it, as on a standalone node, and the ``HANDED_RELEASE`` script elsewhere (user "mixed": shard 0 may)."""
    cluster.flush()
    mark_shards(cluster)
    name = names_per_shard(cluster)[shard]
    owner = primaries(cluster)[shard]
    owner.command("CONFIG", "RESETSTAT")
    async with Redlock([url_as(cluster, "mixed")], queue=False, ttl=5.0) as redlock:
        for _ in range(10):  # until a release found its waiter in line (a hand-over), under any load
            await hand_over_once(redlock, name, owner)
            if not native or calls(owner, "delifeq"):
                break
    assert (calls(owner, "delifeq") >= 1) is native
    assert owner.command("EXISTS", f"redlock:{name}") == 0
    assert refused(owner) == []
    assert_no_library_tasks()


async def hand_over_once(redlock: Redlock, name: str, owner: LocalNode) -> None:
    """A holder of *name*, and a waiter of the same Redlock already waiting when the holder releases."""
    order: list[str] = []
    waiting = redlock.lock(name, acquire_timeout=5.0)

    async def holder() -> None:
        async with redlock.lock(name):
            order.append("first")
            while waiting.statistics().attempts < 1:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)

    async def waiter() -> None:
        while not order:
            await asyncio.sleep(0.01)
        async with waiting:
            order.append("second")
            assert owner.command("GET", f"redlock:{name}")

    await asyncio.gather(holder(), waiter())
    assert order == ["first", "second"]


async def test_a_hand_overs_delifeq_moved_to_a_primary_that_may_not_runs_the_script(cluster: LocalCluster) -> None:
    """A hand-over's release sent as ``DELIFEQ`` to the primary a stale map names (which may run it) answers
    MOVED: it goes to the owner, which may not, as the ``HANDED_RELEASE`` script again, and deletes the key."""
    cluster.flush()
    mark_shards(cluster)
    masters = primaries(cluster)
    name = names_per_shard(cluster)[1]
    key = f"redlock:{name}".encode()
    async with Redlock([url_as(cluster, "mixed")], ttl=5.0) as redlock:
        await redlock.connect()
        voter = cluster_of(redlock).nodes[0]
        assert isinstance(voter, ClusterVoter)
        slot = key_slot(key)
        right = voter.owners[slot]
        wrong = next(shard for shard in voter.shards.values() if shard is not right)
        assert wrong.delifeq
        assert right is not None
        assert not right.delifeq
        masters[1].command("SET", key, "the-token")
        for node in masters:
            node.command("CONFIG", "RESETSTAT")
        voter.owners[slot] = wrong
        assert await voter.send_script(HANDED_RELEASE, (key,), (b"the-token",)) == 1
        assert voter.owners[slot] is right
    assert masters[1].command("EXISTS", key) == 0
    assert [calls(node, "delifeq") for node in masters] == [0, 0]  # (refused by MOVED: no call counted)
    assert refused(masters[1]) == []
    assert_no_library_tasks()
