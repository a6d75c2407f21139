"""The fencing counters' repair beside Cluster voters (issue 39 item 3), on real cluster-mode servers.

A promoted replica that missed counter increments is a node back with old counters: a shard that failed
over counts again, after its quarantine, with counters below what its old primary had. Two Cluster voters
failing over the same name's shard one after the other (each after the other's quarantine) left a grant's
majority without its token: the next grant on those two voters read lower counters (tokens 1 to 5, then
4). So a failed-over shard's counters (the keys of the slots it serves) are raised from the other voters
before it counts again, by the majority rule of a standalone node's repair (docs/fencing.md); and a
standalone node's repair reads the Cluster voters' shards too (it read only the standalone nodes: beside
two Cluster voters, nothing).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async._core import clock, fence_key
from redlock_async._health._fence_repair import CounterRepair, chunks, repair_sources, serving, voter_judged
from redlock_async._nodes import ClusterVoter, Node, endpoints_for, key_slot
from redlock_async.testing import LocalCluster, LocalNode, LocalNodes
from redlock_async.testing._inside import cluster_of
from tests.conftest import mark_in_service
from tests.test_cluster_voter import IN_SERVICE, mark_shards

NAME = "ledger"
TTL = 1.0  # a quarantine of about a second


KEY = fence_key("redlock-fence:", NAME, b"redlock:" + NAME.encode())
"""The name's fencing counter (the one-slot layout of a Redlock with a Cluster voter: in the lock key's slot)."""


def in_service(*voters: LocalCluster | LocalNodes) -> list[str]:
    """The voters' URLs, each marked in service (a deployment serving already: no new deployment judged while
    the test holds the loop in a failover)."""
    for voter in voters:
        if isinstance(voter, LocalCluster):
            mark_shards(voter)
        else:
            for node in voter.nodes:
                mark_in_service(node, period=IN_SERVICE)
    return [url for voter in voters for url in ([voter.url] if isinstance(voter, LocalCluster) else voter.urls)]


async def grant(redlock: Redlock) -> int:
    lock = redlock.lock(NAME)
    assert await lock.acquire(timeout=10.0), lock.outcomes
    token = lock.fencing_token
    assert token is not None
    await lock.release()
    return token


def counter(node: LocalNode, key: bytes) -> int:
    value: Any = node.command("GET", key)
    return int(value or 0)


def shard_of(cluster: LocalCluster, key: bytes) -> int:
    return cluster.shard_of_slot(key_slot(key))


def cut_replica(cluster: LocalCluster, shard: int) -> LocalNode:
    """Stop shard *shard*'s replica and cut its link: it misses every write from now on."""
    master = cluster.master_of(shard)
    replica = cluster.replicas_of(shard)[0]
    master.command("WAIT", 1, 5000)  # it has everything so far
    replica.pause()
    master.command("CLIENT", "KILL", "TYPE", "replica")
    return replica


def fail_over(cluster: LocalCluster, shard: int, replica: LocalNode) -> LocalNode:
    """Promote the cut *replica* (with what it had when cut), its old master stopped meanwhile, then back."""
    master = cluster.master_of(shard)
    master.pause()
    replica.resume()
    new = cluster.failover(shard, replica=replica)
    master.resume()  # it comes back as the new master's replica
    return new


async def counts_again(redlock: Redlock, voter: int, slot: int, new: LocalNode) -> Node:
    """Until *redlock*'s Cluster voter *voter* serves *slot* from *new*'s process and counts its shard again
    (the voter's map read now and then: it is read every few seconds, and after a MOVED)."""
    node: Any = cluster_of(redlock).nodes[voter]
    assert isinstance(node, ClusterVoter)
    async with asyncio.timeout(60):
        while True:
            await node.refresh()
            shard = node.owners[slot]
            if shard is not None and shard.endpoint.port == new.port:
                await shard.connect()
                if shard.connected and shard.quarantined_until <= clock.now():
                    return shard
            await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("in_turn", [True, False], ids=["in-turn", "at-once"])
async def test_two_cluster_voters_failing_over_the_names_shard_never_lower_the_token(
    in_turn: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with LocalCluster(2, 1) as one, LocalCluster(1, 1) as two, LocalNodes(1) as plain:
        async with Redlock(in_service(one, two, plain), fencing=True, ttl=TTL) as redlock:
            key = KEY
            slot = key_slot(key)
            tokens = [await grant(redlock) for _ in range(3)]
            cut = [cut_replica(cluster, shard_of(cluster, key)) for cluster in (one, two)]
            tokens += [await grant(redlock) for _ in range(2)]  # the replicas stay at 3
            assert [counter(c.master_of(shard_of(c, key)), key) for c in (one, two)] == [5, 5]
            promoted: list[LocalNode] = []
            for voter, (cluster, replica) in enumerate(zip((one, two), cut, strict=True)):
                promoted.append(fail_over(cluster, shard_of(cluster, key), replica))
                if in_turn:  # each failed over after the other counts again: a majority kept 5 all along
                    await counts_again(redlock, voter, slot, promoted[-1])
            for voter, new in enumerate(promoted):
                await counts_again(redlock, voter, slot, new)
            raised = [counter(new, key) for new in promoted]
            plain.nodes[0].pause()  # the grant's majority: the two failed-over shards
            try:
                tokens.append(await grant(redlock))
            finally:
                plain.nodes[0].resume()
            assert tokens == [1, 2, 3, 4, 5, 6], f"tokens {tokens}"  # before: [1, 2, 3, 4, 5, 4]
            # Raised from the other voters before each counted again (before: 3 and 3, what the replicas had).
            assert raised == [5, 5]
            # At once, two of the three voters lost those slots' increments: raised from the others as they are
            # (the standalone node has 5), and said. In turn, from a majority that kept its data.
            few = [record for record in caplog.records if "too few other voters" in record.getMessage()]
            assert bool(few) is not in_turn, few


@pytest.mark.slow
async def test_a_standalone_voter_restarted_empty_gets_its_counters_from_the_cluster_voters_shards() -> None:
    with LocalCluster(2, 0) as one, LocalCluster(1, 0) as two, LocalNodes(1) as plain:
        async with Redlock(in_service(one, two, plain), fencing=True, ttl=TTL) as redlock:
            key = KEY
            tokens = [await grant(redlock) for _ in range(3)]
            node = cluster_of(redlock).nodes[2]
            plain.nodes[0].restart(keep_data=False)
            server: Any = plain.nodes[0].command("INFO", "server")
            async with asyncio.timeout(60):
                # Until it counts again, marked in service under its new run id (once its counters were raised).
                while not re.fullmatch(rf"b'{server['run_id']}/\d+'", str(plain.nodes[0].command("GET", "redlock:"))):
                    await node.connect()
                    await asyncio.sleep(0.05)
            assert node.quarantined_until <= clock.now(), node.quarantine_reason
            # Raised from the two Cluster voters' shards before it counted again (before: from nothing, 0).
            assert counter(plain.nodes[0], key) == 3
            master = one.master_of(shard_of(one, key))
            master.pause()  # the grant's majority: the second Cluster voter and the standalone
            try:
                tokens.append(await grant(redlock))
            finally:
                master.resume()
            assert tokens == [1, 2, 3, 4], f"tokens {tokens}"


# -- which voters a repair reads (no servers) -------------------------------------------------------------

SETTINGS: dict[str, Any] = {"max_unanswered": 10, "stall_after": 1.0, "connect_timeout": 1.0, "reconnect_delay": 0.1}


def up(url: str) -> Node:
    """A node that looks connected (what a repair asks of a source), never connected for real."""
    node = Node(endpoints_for([url])[0], **SETTINGS)
    node.outbox.transport = object()  # type: ignore[assignment]
    return node


def cluster(*shards: Node) -> ClusterVoter:
    """A Cluster voter whose map gives the slots to *shards* in equal ranges, in order."""
    voter = ClusterVoter(endpoints_for(["redis+cluster://127.0.0.1:1"])[0], shard_settings=SETTINGS)
    step = len(voter.owners) // len(shards)
    for slot in range(len(voter.owners)):
        voter.owners[slot] = shards[min(slot // step, len(shards) - 1)]
    return voter


def test_a_cluster_voter_is_read_through_the_shards_that_serve_the_slots_repaired() -> None:
    a, b = up("redis://127.0.0.1:11"), up("redis://127.0.0.1:12")
    owners: list[Node | None] = [a] * 3 + [b] * 3 + [None] * 2
    assert serving(owners, frozenset({1, 2})) == [a]
    assert serving(owners, frozenset({2, 3, 7})) == [a, b]  # an unserved slot has no counters there
    assert serving(owners, None) == [a, b]
    assert serving([None] * 4, None) == []


def test_a_cluster_voter_kept_its_data_for_those_slots_only_if_each_shard_serving_them_did() -> None:
    assert voter_judged([(True, False, True), (True, False, True)]) == (True, False, True)
    assert voter_judged([(True, False, True), (True, True, True)]) == (True, True, True)  # one shard behind
    assert voter_judged([(True, False, True), (False, False, True)]) == (False, False, True)  # one not probed
    assert voter_judged([(True, False, True), (True, False, False)]) == (True, False, False)
    assert voter_judged([]) == (False, False, False)  # its map not read: not judged yet


def test_the_sources_of_a_shard_are_every_other_voter_by_the_standalone_majority_rule() -> None:
    # Voters: a standalone node, then Cluster voters A and B; A's shard (voter 1) is repaired.
    assert repair_sources(1, [True] * 3, [False] * 3, [True] * 3) == ([0, 2], 2, True)
    # B's shard of those slots failed over too and is not raised yet: a majority of those slots' voters lost
    # counters at once; raised from the connected others as they are (the caller warns).
    assert repair_sources(1, [True] * 3, [False, False, True], [True] * 3) == ([0, 2], 0, False)
    # B's shard not judged yet: it may still prove whole, so the repair waits for it (a majority needed).
    assert repair_sources(1, [True, True, False], [False] * 3, [True] * 3) == ([0], 2, True)


def test_a_repair_judges_each_cluster_voter_by_its_shards_serving_the_slots_repaired() -> None:
    a1, a2, b1, b2 = (up(f"redis://127.0.0.1:{port}") for port in (21, 22, 31, 32))
    plain = up("redis://127.0.0.1:41")
    voters = [plain, cluster(a1, a2), cluster(b1, b2)]
    repair = CounterRepair(voters, prefix=b"redlock-fence:", timeout=1.0)
    behind = {b2}
    repair.shard_judged = lambda j, shard: (True, shard in behind)
    repair.node_judged = lambda j: (True, False)
    low, high = frozenset({5}), frozenset({16000})
    # B's second shard (the high slots) lost counters: B is behind for the high slots, whole for the low ones.
    assert repair.judged(low) == ([True] * 3, [False] * 3, [True] * 3)
    assert repair.judged(high) == ([True] * 3, [False, False, True], [True] * 3)
    assert repair.judged(None) == ([True] * 3, [False, False, True], [True] * 3)  # a standalone node's: every slot
    b1.outbox.transport = None  # B's first shard not connected: B cannot be read for the low slots
    assert repair.judged(low) == ([True] * 3, [False] * 3, [True, True, False])


def test_a_shards_counters_are_read_with_one_mget_per_slot() -> None:
    keys = [fence_key("redlock-fence:", name, f"redlock:{name}".encode()) for name in ("a", "b", "c", "a")]
    parts = chunks(keys, per_slot=True)
    assert len(parts) == 3
    assert all(len({key_slot(key) for key in part}) == 1 for part in parts)
    assert sorted(key for part in parts for key in part) == sorted(keys)
    assert chunks(keys, per_slot=False) == [keys]


async def test_a_shard_the_map_does_not_name_is_not_called_repaired() -> None:
    # A map read from a node that has not seen the failover yet names the old primary: the promoted one serves no
    # slot for a moment. Called done, it would be marked in service with its counters low (it was: None).
    old, promoted = up("redis://127.0.0.1:51"), up("redis://127.0.0.1:52")
    voters = [up("redis://127.0.0.1:53"), cluster(old), up("redis://127.0.0.1:54")]
    repair = CounterRepair(voters, prefix=b"redlock-fence:", timeout=1.0)
    why = await repair.shard(1, promoted)
    assert why is not None
    assert "serves no slot" in why
