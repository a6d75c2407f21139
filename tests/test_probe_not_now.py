"""The permissions probe judges the user's rights, not the node's state (found by the attack on issue 38's
probe): two of three nodes full under ``noeviction`` (every write answers OOM) made ``connect()`` raise
"let the user run EVAL, EVALSHA and SCRIPT (ACL +@scripting) ... the ACL line in docs/deployment.md", so
a Redlock could not even open, and the operator was sent to the ACL. A full node is a node in trouble: it
votes no lock (an error) until memory is freed, and the Redlock serves as soon as it is."""

from __future__ import annotations

import logging

import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalNodes


async def test_nodes_out_of_memory_at_connect_are_not_blamed_on_the_acl(caplog: pytest.LogCaptureFixture) -> None:
    with LocalNodes(3) as nodes:
        for i in (0, 1):
            nodes[i].command("CONFIG", "SET", "maxmemory-policy", "noeviction")
            nodes[i].command("CONFIG", "SET", "maxmemory", "1")
        caplog.set_level(logging.WARNING, logger="redlock_async")
        async with Redlock(nodes.urls) as redlock:  # before: RedlockError, "refuse commands ... ACL"
            lock = redlock.lock("probe:oom", ttl=5.0)
            assert not await lock.acquire(blocking=False)  # full: the nodes vote no lock
            for i in (0, 1):
                nodes[i].command("CONFIG", "SET", "maxmemory", "0")
            assert await lock.acquire(blocking=False)  # freed: served, no reconnect, no new Redlock
            await lock.release()
        told = [r.getMessage() for r in caplog.records if "permissions probe" in r.getMessage()]
        assert len(told) == 2, told
        assert all("out of memory" in line and "OOM" in line for line in told), told
        assert not any("ACL" in r.getMessage() or "refuses what" in r.getMessage() for r in caplog.records)


async def test_first_use_with_nodes_out_of_memory_is_not_an_acl_error() -> None:
    """The same at first use (no connect()): the acquire meets full nodes, not a permissions error."""
    with LocalNodes(3) as nodes:
        for i in (1, 2):
            nodes[i].command("CONFIG", "SET", "maxmemory-policy", "noeviction")
            nodes[i].command("CONFIG", "SET", "maxmemory", "1")
        redlock = Redlock(nodes.urls)
        try:
            assert not await redlock.lock("probe:oom1", ttl=5.0).acquire(blocking=False)  # before: RedlockError
        finally:
            await redlock.aclose()
