"""Evictions noticed live (issue 38 item 2), on real nodes under memory pressure: ``maxmemory`` just above
what the nodes use, ``allkeys-lru``, and junk written until a held lock's key and its fencing counter are
evicted on every node. Before: a second client took the lock while the first held it (two holders), with
the same fencing token (1 -> 1). Now each node that evicted sits out a quarantine period (its INFO stats,
read right before each vote on a node whose policy can evict, shows ``evicted_keys`` grew), the holder
drops it, and a token read after that is floored by the node's clock: it never repeats."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import pytest

from redlock_async import EventKind, LockEvent, LockLost, Redlock
from redlock_async._health._evictions import RECHECK
from redlock_async.testing import LocalNode, LocalNodes

from .conftest import assert_no_library_tasks

TTL = 2.0


def info(node: LocalNode, section: str, field: str) -> int:
    reply = node.command("INFO", section)
    assert isinstance(reply, dict), reply
    return int(reply[field])


def used_memory(node: LocalNode) -> int:
    return info(node, "memory", "used_memory")


def evicted(node: LocalNode) -> int:
    return info(node, "stats", "evicted_keys")


@pytest.fixture
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3) as nodes:
        for node in nodes:
            node.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
            node.command("CONFIG", "SET", "maxmemory", str(used_memory(node) + 2 * 1024 * 1024))
        yield nodes


def fill_until_gone(nodes: LocalNodes, *keys: str) -> None:
    """Junk written to every node until each of *keys* was evicted there."""
    junk = "x" * 20_000
    for node in nodes:
        for i in range(5000):
            node.command("SET", f"junk:{i}", junk)
            if i % 20 == 19 and not any(node.command("EXISTS", key) for key in keys):
                break
        assert not any(node.command("EXISTS", key) for key in keys), f"{keys} not evicted on {node}"
        assert evicted(node) > 0


def relieve(nodes: LocalNodes) -> None:
    for node in nodes:
        node.command("CONFIG", "SET", "maxmemory", "0")


async def test_an_evicted_lock_key_lets_no_second_holder_in_and_no_token_repeats(nodes: LocalNodes) -> None:
    events: list[LockEvent] = []
    async with (
        Redlock(nodes.urls, ttl=TTL, fencing=True) as first,
        Redlock(nodes.urls, ttl=TTL, fencing=True, on_event=events.append) as second,
    ):
        holder = first.lock("ev:lock", ttl=30.0)  # held through every step below, however slow
        assert await holder.acquire(blocking=False)
        token = holder.fencing_token
        assert token is not None
        fill_until_gone(nodes, "redlock:ev:lock", "redlock-fence:ev:lock")

        # A client that knew the nodes: their evicted_keys grew since it last read them.
        other = second.lock("ev:lock")
        assert not await other.acquire(blocking=False), (
            f"a second holder while the first holds (tokens {token} -> {other.fencing_token})"
        )
        held_out = [outcome for outcome in other.outcomes if "in eviction quarantine" in outcome.detail]
        assert len(held_out) >= 2, other.outcomes  # a majority: the verdict is in
        told = [event for event in events if event.kind is EventKind.EVICTED]
        assert len(told) == 3, told
        assert all("evicted keys" in event.reason for event in told)

        # A client that meets the nodes now: evicted_keys above 0, when no one can say.
        async with Redlock(nodes.urls, ttl=TTL, fencing=True) as third:
            assert not await third.lock("ev:lock").acquire(blocking=False)

        # Inspection and `redlock status` say so: those nodes rule out no holder.
        found = await second.inspect("ev:lock")
        assert [view.state for view in found.nodes] == ["quarantined"] * 3, found.nodes
        assert all(view.error.startswith("it evicted keys") for view in found.nodes), found.nodes
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "redlock_async", "status", "ev:lock", "--nodes", ",".join(nodes.urls),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        assert "3 more that evicted keys (maxmemory-policy)" in out.decode(), out.decode()

        # The holder drops the nodes at its next vote (it reads them too): lost, not extended on keys gone.
        with pytest.raises(LockLost, match="evicted keys"):  # dropped for the evictions, before the reply
            await holder.extend()
        assert not holder.held

        # Pressure gone and a period later, the nodes count again; the counter evicted, the token is floored.
        relieve(nodes)
        later = second.lock("ev:lock")
        assert await later.acquire(timeout=TTL * 4)
        assert later.fencing_token is not None
        assert later.fencing_token > token, (token, later.fencing_token)
        await later.release()
    assert_no_library_tasks()


async def test_a_node_that_cannot_evict_sends_nothing_more(nodes: LocalNodes) -> None:
    """noeviction: no INFO stats before each vote (where nothing can be evicted, the policy and the count are
    read again at most once per RECHECK s, ahead of a vote: a policy may be turned evicting live)."""
    for node in nodes:
        node.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        node.command("CONFIG", "RESETSTAT")
    began = time.monotonic()
    async with Redlock(nodes.urls, ttl=TTL) as redlock:
        for _ in range(5):
            lock = redlock.lock("ev:quiet")
            assert await lock.acquire(blocking=False)
            await lock.release()
    rechecks = 2 * (1 + int((time.monotonic() - began) / RECHECK))  # INFO memory and INFO stats each
    for node in nodes:
        stats = node.command("INFO", "commandstats")
        assert isinstance(stats, dict), stats
        calls = stats["cmdstat_info"]
        # The handshake's sections per connection (votes and pub/sub, five each), and nothing per vote.
        assert calls["calls"] <= 2 * 5 + 1 + rechecks, calls
