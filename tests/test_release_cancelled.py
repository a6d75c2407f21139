"""A release cancelled while it waits for the answers that decide whether it failed still says it released
(found by the attack on issue 38 item 5): the ``released`` event, which the metrics' "locks held now"
count and any listener rely on, was emitted when the cancel came during the release's first wait, but not
during the second (a holder answered an error, the other nodes' answers waited for up to the node
timeout): the lock was no longer held, and no event said so (the held-now gauge stayed at one)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import EventKind, LockEvent, Redlock
from redlock_async.testing import LocalNodes

from .conftest import assert_no_library_tasks
from .test_acl import documented_rules, urls_of


@pytest.fixture
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3, password="default-pw", acl=[documented_rules()]) as nodes:
        yield nodes


async def test_a_release_cancelled_while_its_failure_is_judged_emits_released(nodes: LocalNodes) -> None:
    events: list[LockEvent] = []
    async with Redlock(urls_of(nodes), on_event=events.append, ttl=30.0, node_timeout=2.0) as redlock:
        lock = redlock.lock("rc:lock", ttl=30.0)
        nodes[2].pause()  # silent: the grant is nodes 0 and 1's
        try:
            assert await lock.acquire(blocking=False)
            nodes[0].command("ACL", "SETUSER", "redlock", "-eval", "-evalsha")  # a holder will answer an error
            release = asyncio.ensure_future(lock.release())
            # The holders answer at once (an error, a yes); node 2's answer is then waited for, up to 2 s.
            await asyncio.sleep(0.5)
            assert not release.done()
            release.cancel()
            with pytest.raises(asyncio.CancelledError):
                await release
        finally:
            nodes[2].resume()
            nodes[0].command("ACL", "SETUSER", "redlock", "+eval", "+evalsha")
        assert not lock.held
        kinds = [event.kind for event in events if event.kind in (EventKind.RELEASED, EventKind.LOST)]
        assert kinds == [EventKind.RELEASED], events  # before: [] (no word that it ended)
    assert_no_library_tasks()
