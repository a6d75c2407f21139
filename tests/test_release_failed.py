"""A release that could not run on a majority says so (issue 38 item 5), on real nodes: the documented ACL
user loses its scripting rights on two of three nodes after the acquire (or two nodes are stopped), so the
release answers errors there and the key stays a whole ttl. Every primitive that releases raises
``ReleaseFailed`` with the per-node reasons from ``release()`` and from leaving its block when the body
succeeded; a body's own exception wins, the failure added as a note; the ``released`` event carries it.
Before: each of these returned normally (a log line only)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from redlock_async import EventKind, LockEvent, Redlock, ReleaseFailed
from redlock_async import sync as blocking
from redlock_async.testing import LocalNodes

from .conftest import assert_no_library_tasks
from .test_acl import documented_rules, urls_of


@pytest.fixture(scope="module")
def _servers() -> Iterator[LocalNodes]:
    with LocalNodes(3, password="default-pw", acl=[documented_rules()]) as nodes:
        yield nodes


@pytest.fixture
def nodes(_servers: LocalNodes) -> Iterator[LocalNodes]:
    _servers.flush()
    yield _servers
    allow(_servers, range(3))


def revoke(nodes: LocalNodes, which: Any) -> None:
    """The user may no longer run scripts on nodes *which* (its connections open: the rule applies at once)."""
    for i in which:
        nodes[i].command("ACL", "SETUSER", "redlock", "-eval", "-evalsha")


def allow(nodes: LocalNodes, which: Any) -> None:
    for i in which:
        nodes[i].command("ACL", "SETUSER", "redlock", "+eval", "+evalsha")


@contextlib.asynccontextmanager
async def redlock_of(nodes: LocalNodes, events: list[LockEvent], **settings: Any) -> AsyncIterator[Redlock]:
    async with Redlock(urls_of(nodes), on_event=events.append, **settings) as redlock:
        yield redlock


def released(events: list[LockEvent]) -> list[LockEvent]:
    return [event for event in events if event.kind is EventKind.RELEASED]


def assert_told(failure: ReleaseFailed, name: str) -> None:
    assert failure.name == name
    assert "was not released" in str(failure)
    refused = [o for o in failure.outcomes if "NOPERM" in o.detail]
    assert len(refused) == 2, failure.outcomes


async def test_release_raises_with_the_reasons_and_the_event_carries_them(nodes: LocalNodes) -> None:
    events: list[LockEvent] = []
    async with redlock_of(nodes, events) as redlock:
        lock = redlock.lock("rf:lock", ttl=30.0)
        assert await lock.acquire(blocking=False)
        revoke(nodes, [0, 1])
        with pytest.raises(ReleaseFailed) as caught:
            await lock.release()
        assert_told(caught.value, "rf:lock")
        assert not lock.held
        [event] = released(events)
        assert "was not released" in event.reason
        allow(nodes, [0, 1])
        # The key is still there on the two nodes, as the error says: no one can take the lock.
        other = redlock.lock("rf:lock", ttl=30.0)
        assert not await other.acquire(blocking=False)
    assert_no_library_tasks()


async def test_a_release_refused_by_one_node_of_three_is_a_release(nodes: LocalNodes) -> None:
    events: list[LockEvent] = []
    async with redlock_of(nodes, events) as redlock:
        lock = redlock.lock("rf:one", ttl=30.0)
        async with lock:
            revoke(nodes, [0])
        [event] = released(events)
        assert event.reason == ""
        allow(nodes, [0])
        assert await redlock.lock("rf:one", ttl=30.0).acquire(blocking=False)  # two of three free: taken


async def test_a_body_that_raised_keeps_its_exception_with_the_failure_as_a_note(nodes: LocalNodes) -> None:
    events: list[LockEvent] = []
    async with redlock_of(nodes, events) as redlock:
        with pytest.raises(ValueError, match="the body's own") as caught:
            async with redlock.lock("rf:body", ttl=30.0):
                revoke(nodes, [1, 2])
                raise ValueError("the body's own")
        notes = getattr(caught.value, "__notes__", [])
        assert len(notes) == 1, notes
        assert "ReleaseFailed" in notes[0], notes
        assert "was not released" in notes[0], notes
        [event] = released(events)
        assert "was not released" in event.reason


def _lock(redlock: Redlock) -> Any:
    return redlock.lock("rf:p", ttl=30.0)


def _fenced(redlock: Redlock) -> Any:
    return redlock.lock("rf:p", ttl=30.0, fencing=True)


def _many(redlock: Redlock) -> Any:
    return redlock.lock_many(["rf:p", "rf:q"], ttl=30.0)


def _semaphore(redlock: Redlock) -> Any:
    return redlock.semaphore("rf:p", limit=2, ttl=30.0)


def _reader(redlock: Redlock) -> Any:
    return redlock.rw_lock("rf:p", ttl=30.0).read()


def _writer(redlock: Redlock) -> Any:
    return redlock.rw_lock("rf:p", ttl=30.0).write()


def _reentrant(redlock: Redlock) -> Any:
    return redlock.lock("rf:p", ttl=30.0, reentrant=True)


def _election(redlock: Redlock) -> Any:
    return redlock.election("rf:p", ttl=30.0).campaign()


MAKERS: list[Callable[[Redlock], Any]] = [
    _lock,
    _fenced,
    _many,
    _semaphore,
    _reader,
    _writer,
    _reentrant,
    _election,
]


@pytest.mark.parametrize("queue", [True, False], ids=["queue", "words"])
@pytest.mark.parametrize("make", MAKERS, ids=lambda make: make.__name__.strip("_"))
async def test_every_primitive_raises_on_leaving_its_block(
    nodes: LocalNodes, make: Callable[[Redlock], Any], queue: bool
) -> None:
    events: list[LockEvent] = []
    async with redlock_of(nodes, events, queue=queue) as redlock:
        with pytest.raises(ReleaseFailed) as caught:
            async with make(redlock):
                revoke(nodes, [0, 2])
        assert "NOPERM" in str(caught.value)
        assert sum("NOPERM" in o.detail for o in caught.value.outcomes) == 2, caught.value.outcomes
        assert any("was not released" in event.reason for event in released(events)), released(events)
    assert_no_library_tasks()


@pytest.mark.parametrize("make", [_lock, _semaphore, _reader, _reentrant], ids=lambda make: make.__name__.strip("_"))
async def test_every_release_call_raises(nodes: LocalNodes, make: Callable[[Redlock], Any]) -> None:
    async with redlock_of(nodes, []) as redlock:
        lock = make(redlock)
        assert await lock.acquire(blocking=False)
        revoke(nodes, [0, 1])
        with pytest.raises(ReleaseFailed):
            await lock.release()
        assert not lock.held


def test_the_blocking_api_raises_from_release_and_with(nodes: LocalNodes) -> None:
    with blocking.Redlock(urls_of(nodes)) as redlock:
        lock = redlock.lock("rf:sync", ttl=30.0)
        with pytest.raises(ReleaseFailed) as caught, lock:
            revoke(nodes, [0, 1])
        assert_told(caught.value, "rf:sync")
        allow(nodes, [0, 1])
        nodes.flush()
        lock = redlock.lock("rf:sync2", ttl=30.0)
        assert lock.acquire(blocking=False)
        revoke(nodes, [1, 2])
        with pytest.raises(ReleaseFailed):
            lock.release()
        allow(nodes, [1, 2])
        nodes.flush()
        with pytest.raises(KeyError) as body, redlock.lock("rf:sync3", ttl=30.0):
            revoke(nodes, [0, 2])
            raise KeyError("body")
        assert any("ReleaseFailed" in note for note in getattr(body.value, "__notes__", []))
        allow(nodes, [0, 2])
        nodes.flush()
        reentrant = redlock.lock("rf:sync4", ttl=30.0, reentrant=True)
        with pytest.raises(ReleaseFailed), reentrant:
            with reentrant:
                pass
            revoke(nodes, [0, 1])
        allow(nodes, [0, 1])
        assert reentrant.acquire(blocking=False) is False  # the key stays; but it is no longer held here either


async def test_nodes_stopped_after_the_acquire() -> None:
    """Two of three nodes killed while held: the release cannot run there (connection refused)."""
    with LocalNodes(3) as nodes:
        events: list[LockEvent] = []
        async with Redlock(nodes.urls, on_event=events.append) as redlock:
            with pytest.raises(ReleaseFailed) as caught:
                async with redlock.lock("rf:killed", ttl=30.0):
                    nodes[0].kill()
                    nodes[1].kill()
                    await asyncio.sleep(0.05)
            failed = [o for o in caught.value.outcomes if o.vote.value == "error"]
            assert len(failed) == 2, caught.value.outcomes
            assert any("was not released" in event.reason for event in released(events))
    assert_no_library_tasks()
