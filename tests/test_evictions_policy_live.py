"""A maxmemory-policy turned evicting while in use (found by the attack on issue 38 item 2): the policy was
read at the handshake only, so nodes that said ``noeviction`` when the Redlock connected and were switched
to ``allkeys-lru`` later (``CONFIG SET``, as a managed service's parameter change applies live) were never
watched: their evictions went unnoticed, and a second task of the same Redlock took the lock while the
first held it. Now a node not watched has its policy and ``evicted_keys`` read again ahead of a vote once
``RECHECK`` s passed since the last reading: the evictions since are found before that vote counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async._health._evictions import RECHECK
from redlock_async.testing import LocalNodes

from .conftest import assert_no_library_tasks
from .test_evictions import fill_until_gone, relieve, used_memory

TTL = 2.0


@pytest.fixture
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3) as nodes:
        for node in nodes:
            node.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        yield nodes


async def test_a_policy_switched_to_evicting_while_connected_lets_no_second_holder_in(nodes: LocalNodes) -> None:
    async with Redlock(nodes.urls, ttl=TTL, fencing=True) as redlock:
        holder = redlock.lock("evp:lock")
        assert await holder.acquire(blocking=False)
        token = holder.fencing_token
        for node in nodes:  # the operator's change, live
            node.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
            node.command("CONFIG", "SET", "maxmemory", str(used_memory(node) + 2 * 1024 * 1024))
        try:
            fill_until_gone(nodes, "redlock:evp:lock", "redlock-fence:evp:lock")
            # The policy is read again ahead of a vote once RECHECK s passed since the last reading (the
            # window left: evictions within RECHECK s of a reading that still said noeviction).
            await asyncio.sleep(RECHECK)
            other = redlock.lock("evp:lock")
            got = await other.acquire(blocking=False)
            assert not got, f"a second holder while the first holds (tokens {token} -> {other.fencing_token})"
        finally:
            relieve(nodes)
    assert_no_library_tasks()
