"""Servers in shapes a voter must not have, on real servers: a replica, a cluster-mode node, a master with
replicas. A replica or a cluster-mode node is refused at connect in words that name what it is and what
to list instead; a master with replicas is used, with one warning that names it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from redlock_async import NodesUnavailable, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._nodes._wire import error_reply
from redlock_async.testing import LocalNode, LocalNodes

from .conftest import assert_no_library_tasks, mark_in_service


@pytest.fixture
def masters() -> Iterator[LocalNodes]:
    with LocalNodes(3) as nodes:
        for node in nodes:
            node.command("CONFIG", "SET", "repl-diskless-sync-delay", "0")  # a replica links at once
        yield nodes


def wait_for_link(replica: LocalNode) -> None:
    """Until the replica reports its link to the master up (bounded)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        info = replica.command("INFO", "replication")
        assert isinstance(info, dict)
        if info.get("master_link_status") == "up":
            return
        time.sleep(0.05)
    raise AssertionError("the replica never linked to its master")


def cluster_port() -> int:
    """A free port a cluster-mode node can take: its bus listens 10000 higher, so at most 55535."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port <= 55535:
            return port
    raise AssertionError("no free port at most 55535")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_replica_is_refused_as_a_voter_in_words(masters: LocalNodes, caplog: pytest.LogCaptureFixture) -> None:
    first = masters.nodes[0]
    with LocalNode(server_args=("--replicaof", "127.0.0.1", str(first.port))) as replica:
        wait_for_link(replica)
        for node in masters.nodes[1:]:
            mark_in_service(node)  # a cluster met with a node refused is not known to be new: one in service
        urls = [replica.url, *masters.urls[1:]]
        async with Redlock(urls, acquire_timeout=0.2, auto_extend=False) as redlock:
            lock = redlock.lock("roles:replica", ttl=5.0)
            assert await lock.acquire(blocking=False)  # the two masters decide
            refused = lock.outcomes[0]  # decided by the two masters, maybe before it was refused again
            assert refused.vote is Vote.PENDING or (refused.vote is not Vote.YES and "replica" in refused.detail)
            await lock.release()
        texts = warnings_of(caplog)
        name = f"127.0.0.1:{replica.port}"
        assert any(name in text and "is a replica" in text and str(first.port) in text for text in texts), texts

        # The master itself, listed: used, with one warning naming it.
        caplog.clear()
        async with Redlock(masters.urls, auto_extend=False) as redlock:
            lock = redlock.lock("roles:master", ttl=5.0)
            for _ in range(3):
                assert await lock.acquire(blocking=False)
                await lock.release()
        texts = [t for t in warnings_of(caplog) if "connected replica" in t]
        assert len(texts) == 1, texts
        assert f"127.0.0.1:{first.port}" in texts[0]
    assert_no_library_tasks()


async def test_all_replicas_never_give_a_lock(masters: LocalNodes) -> None:
    replicas = [LocalNode(server_args=("--replicaof", "127.0.0.1", str(m.port))) for m in masters.nodes]
    try:
        for replica in replicas:
            replica.start()  # a replica says so from its start, linked or not yet
        async with Redlock([r.url for r in replicas], acquire_timeout=0.2) as redlock:
            with pytest.raises(NodesUnavailable) as caught:
                async with redlock.lock("roles:all-replicas"):
                    pytest.fail("acquired on replicas")
            assert all("replica" in outcome.detail for outcome in caught.value.outcomes), caught.value.outcomes
        for replica in replicas:
            assert replica.command("DBSIZE") == 0
    finally:
        for replica in replicas:
            replica.close()
    assert_no_library_tasks()


async def test_a_cluster_mode_node_is_refused_in_words(caplog: pytest.LogCaptureFixture) -> None:
    """A redis:// URL to a cluster-mode node: refused at connect naming cluster mode, never half-working (a
    plain SET that works beside scripts refused with CROSSSLOT)."""
    with (
        LocalNode(port=cluster_port(), server_args=("--cluster-enabled", "yes")) as clustered,
        LocalNodes(2) as standalone,
    ):
        clustered.command("CLUSTER", "ADDSLOTS", *range(16384))  # every slot served (ADDSLOTSRANGE is 7.0+)
        for node in standalone.nodes:
            mark_in_service(node)  # a cluster met with a node refused is not known to be new: one in service
        urls = [clustered.url, *standalone.urls]
        async with Redlock(urls, acquire_timeout=0.2, auto_extend=False) as redlock:
            lock = redlock.lock("roles:cluster", ttl=5.0)
            assert await lock.acquire(blocking=False)
            refused = lock.outcomes[0]
            assert refused.vote is Vote.PENDING or (refused.vote is not Vote.YES and "cluster mode" in refused.detail)
            await lock.release()
        name = f"127.0.0.1:{clustered.port}"
        assert any(name in text and "cluster mode" in text for text in warnings_of(caplog)), warnings_of(caplog)
        assert clustered.command("DBSIZE") == 0
    assert_no_library_tasks()


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        ("MOVED 14692 127.0.0.1:7002", "MOVED 14692 127.0.0.1:7002"),
        ("CROSSSLOT Keys in request don't hash to the same slot", "CROSSSLOT Keys in request"),
        ("NOPERM User alice has no permissions to run the 'pexpire' command", "NOPERM User alice has no"),
        ("OOM command not allowed when used memory > 'maxmemory'.", "OOM command not allowed"),
        ("READONLY You can't write against a read only replica.", "READONLY You can't write"),
        ("ERR unknown command 'DELIFEQ'", "unknown command 'DELIFEQ'"),
    ],
)
def test_server_errors_keep_their_code_word(reply: str, detail: str) -> None:
    failure = error_reply(reply)
    assert failure.detail.startswith(detail), failure.detail
    assert failure.answered


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl"])
async def test_a_policy_that_can_evict_lock_keys_warns_once_per_node(
    masters: LocalNodes, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    """Lock keys have a ttl, so volatile-* evicts them too; noeviction (or no maxmemory) says nothing."""
    evicting, plain, unlimited = masters.nodes
    evicting.command("CONFIG", "SET", "maxmemory", "100mb")
    evicting.command("CONFIG", "SET", "maxmemory-policy", policy)
    plain.command("CONFIG", "SET", "maxmemory", "100mb")
    plain.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    unlimited.command("CONFIG", "SET", "maxmemory-policy", policy)  # no maxmemory: nothing is evicted
    async with Redlock(masters.urls, auto_extend=False) as redlock:
        lock = redlock.lock("roles:eviction", ttl=5.0)
        for _ in range(2):
            assert await lock.acquire(blocking=False)
            await lock.release()
    texts = [t for t in warnings_of(caplog) if "maxmemory-policy" in t]
    assert len(texts) == 1, texts
    assert f"127.0.0.1:{evicting.port}" in texts[0]
    assert policy in texts[0]
    assert "noeviction" in texts[0]


async def until_connected(redlock: Redlock, index: int) -> None:
    """Use *redlock* until its connection to node *index* is up again (bounded)."""
    deadline = time.monotonic() + 20.0
    while not redlock.statistics().nodes[index].connected:
        assert time.monotonic() < deadline, f"node {index} never connected again"
        lock = redlock.lock("roles:scratch", ttl=30.0)
        if await lock.acquire(blocking=False):
            await lock.release()
        await asyncio.sleep(0.05)


async def test_a_voter_made_a_replica_in_use_says_so_then_sits_out_as_a_master_again(
    masters: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """REPLICAOF on a node in use keeps the clients' connections. Before: its votes were READONLY errors and
    nothing said why; once a master again (REPLICAOF NO ONE) it counted at once, holding its master's data,
    so a lock held on the other two nodes went to a second client on that master and this node."""
    first, _, third = masters.nodes
    async with Redlock(masters.urls, auto_extend=False) as holder, Redlock(masters.urls) as other:
        await holder.connect()
        await other.connect()
        lock = holder.lock("roles:moved", ttl=30.0)
        assert await lock.acquire(blocking=False)
        first.command("DEL", "redlock:roles:moved")  # held on the second and third nodes only

        third.command("REPLICAOF", "127.0.0.1", str(first.port))
        wait_for_link(third)
        probe = other.lock("roles:scratch", ttl=30.0)
        assert await probe.acquire(blocking=False)  # the two masters decide; the third answers READONLY
        await probe.release()
        name = f"127.0.0.1:{third.port}"
        deadline = time.monotonic() + 20.0
        while not any(name in t and "became a replica" in t for t in warnings_of(caplog)):
            assert time.monotonic() < deadline, warnings_of(caplog)
            await asyncio.sleep(0.05)

        third.command("REPLICAOF", "NO", "ONE")  # a master again, with the first node's data
        await until_connected(other, 2)
        assert other.statistics().nodes[2].quarantined
        rival = other.lock("roles:moved", ttl=30.0)
        assert not await rival.acquire(blocking=False), "a second holder, on the first node and the third"
        assert lock.held
        await lock.release()
    assert_no_library_tasks()
