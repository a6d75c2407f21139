"""Failover as restart, on real servers: a replica promoted without a lock key it never received, behind an
address that follows the master (a managed primary endpoint, a virtual IP: here a proxy that asks the
Sentinels at every new connection), must sit out like a node restarted empty, for a client that knew the
old master and for one that meets the new master first (issue 39, item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async._nodes._handshake import info_fields, promoted
from redlock_async.testing import LocalNode, LocalNodes, LocalSentinels, Proxy

from .conftest import assert_no_library_tasks, mark_in_service

pytestmark = pytest.mark.slow

TTL = 15.0
"""Every client's ttl: the quarantine period is this plus drift."""


def test_promoted_reads_info_replication() -> None:
    never = b"role:master\r\nmaster_replid2:0000000000000000000000000000000000000000\r\nsecond_repl_offset:-1\r\n"
    after = b"role:master\r\nmaster_replid2:5e2a0c1f00000000000000000000000000000000\r\nsecond_repl_offset:1234\r\n"
    assert not promoted(info_fields(never))
    assert promoted(info_fields(after))
    assert not promoted({})  # INFO refused: nothing to tell


def test_a_master_that_was_a_replica_reads_as_promoted() -> None:
    with LocalNodes(2) as nodes:
        first, second = nodes
        assert not promoted(info_fields(_raw_replication(second)))
        second.command("REPLICAOF", "127.0.0.1", str(first.port))
        second.command("REPLICAOF", "NO", "ONE")
        assert promoted(info_fields(_raw_replication(second)))
        assert not promoted(info_fields(_raw_replication(first)))


def _raw_replication(node: object) -> bytes:
    info = node.command("INFO", "replication")  # type: ignore[attr-defined]
    return "\r\n".join(f"{k}:{v}" for k, v in info.items() if not isinstance(v, dict)).encode()


@pytest.fixture
def group() -> Iterator[LocalSentinels]:
    with LocalSentinels(1, 3) as sentinels:
        yield sentinels


def uptime(node: object) -> float:
    info = node.command("INFO", "server")  # type: ignore[attr-defined]
    return float(info["uptime_in_seconds"])


def cut_link(replica: LocalNode) -> None:
    """Cut *replica*'s link to its master for good: a wrong masterauth keeps it from linking again (bounded)."""
    replica.command("CONFIG", "SET", "masterauth", "not-the-password")
    replica.command("CLIENT", "KILL", "TYPE", "master")
    deadline = time.monotonic() + 10.0
    while replica.command("INFO", "replication")["master_link_status"] != "down":  # type: ignore[index]
        assert time.monotonic() < deadline, "the replica kept its link"
        time.sleep(0.05)


async def tries(redlock: Redlock, name: str, index: int, seconds: float) -> int:
    """Non-blocking acquires of *name* by *redlock* for *seconds* once its node *index* is connected
    (bounded); how many got the lock (each released at once)."""
    deadline = time.monotonic() + 20.0
    while not redlock.statistics().nodes[index].connected:
        assert time.monotonic() < deadline, f"node {index} never connected"
        with contextlib.suppress(Exception):
            await redlock.lock("failover:scratch", ttl=TTL).acquire(blocking=False)
        await asyncio.sleep(0.05)
    won = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock = redlock.lock(name, ttl=TTL)
        if await lock.acquire(blocking=False):
            won += 1
            await lock.release()
        await asyncio.sleep(0.05)
    return won


async def test_a_replica_promoted_without_the_key_behind_a_moving_address_sits_out(group: LocalSentinels) -> None:
    def master_port() -> int:
        try:
            return group.master().port
        except Exception:
            return group.servers[0].port  # the Sentinels do not answer: the old master, down or not

    old, replica = group.servers
    with LocalNodes(2) as others, Proxy(master_port) as address:
        urls = [address.url, *others.urls]
        for node in (old, *others):
            mark_in_service(node, TTL + 1.0)
        # The replica's uptime must not excuse it: older than a quarantine period when promoted.
        while uptime(replica) < TTL + 2.0:
            await asyncio.sleep(0.25)
        async with Redlock(urls, ttl=TTL, auto_extend=False) as holder, Redlock(urls, ttl=TTL) as knew:
            await holder.connect()
            await knew.connect()  # knows the old master (its run_id, its marker)
            cut_link(replica)  # the master's writes never reach its replica
            lock = holder.lock("failover:held", ttl=TTL)
            assert await lock.acquire(blocking=False)
            others[1].command("DEL", "redlock:failover:held")  # held on a bare majority: the master, others[0]
            old.kill()  # the key is lost with it
            new = await asyncio.to_thread(group.await_failover, old)
            assert new is replica
            assert replica.command("EXISTS", "redlock:failover:held") == 0
            assert address.upstream[1] == replica.port

            async with Redlock(urls, ttl=TTL) as fresh:
                won_fresh = await tries(fresh, "failover:held", 0, 1.5)
            won_knew = await tries(knew, "failover:held", 0, 1.5)
            assert lock.validity > 0, "the holder's lease ran out before the contenders were done: too slow a box"
            assert (won_fresh, won_knew) == (0, 0), "a second holder, on the promoted replica and others[1]"
            stats = knew.statistics().nodes[0]
            assert stats.quarantined
    assert_no_library_tasks()
