"""One vocabulary on the public face: ``name`` for the locked thing, typed states, ``campaign(timeout=)``.

The old spellings (``.resource``, ``resource=``, ``campaign(seconds)``) still work for this release,
each with a ``DeprecationWarning`` that says what to write instead.
"""

from __future__ import annotations

from typing import get_args

import pytest

import redlock_async
from redlock_async import (
    EventKind,
    LockEvent,
    LockLost,
    LockNotAcquired,
    LockPhase,
    LockState,
    NodeState,
    NodesUnavailable,
    Redlock,
    StaleFencingToken,
)
from redlock_async._rounds._lease import Phase
from redlock_async.sync import Redlock as SyncRedlock
from tests.conftest import Cluster

URL = "redis://127.0.0.1:1"  # never connected to: making locks reads no node


def test_lock_name_and_its_old_spelling() -> None:
    redlock = Redlock([URL])
    lock = redlock.lock("orders:42")
    many = redlock.lock_many(["b", "a"])
    assert lock.name == "orders:42"
    assert many.name == ("a", "b")
    assert lock.statistics().name == "orders:42"
    with pytest.warns(DeprecationWarning, match=r"Lock\.resource is deprecated .* use \.name") as told:
        assert lock.resource == "orders:42"
    assert told[0].filename == __file__  # points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"Lock\.resource"):
        assert many.resource == ("a", "b")
    with pytest.warns(DeprecationWarning, match=r"LockStatistics\.resource is deprecated .* use \.name"):
        assert many.statistics().resource == ("a", "b")
    semaphore = redlock.semaphore("pool", limit=2)
    assert semaphore.name == "pool"


@pytest.mark.parametrize("cls", [LockNotAcquired, LockLost, NodesUnavailable, redlock_async.NestedAcquire])
def test_error_name_and_its_old_spellings(cls: type[redlock_async.RedlockError]) -> None:
    error = cls("no", name="busy")
    assert error.name == "busy"
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\.resource is deprecated .* use \.name") as told:
        assert error.resource == "busy"
    assert told[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\(resource=\) is deprecated .* use name="):
        old = cls("no", resource="busy")
    assert old.name == "busy"
    with pytest.raises(TypeError, match=rf"{cls.__name__}\(\) needs name="):
        cls("no")


def test_stale_fencing_token_name() -> None:
    error = StaleFencingToken("refused", name="key", token=1, seen=2)
    assert (error.name, error.token, error.seen) == ("key", 1, 2)
    with pytest.warns(DeprecationWarning, match=r"StaleFencingToken\(resource=\)"):
        assert StaleFencingToken("refused", resource="key", token=1, seen=2).name == "key"


def test_event_name_and_its_old_spellings() -> None:
    event = LockEvent(EventKind.RELEASED, "orders:42", held_for=0.5)
    assert event.name == "orders:42"
    assert "'orders:42'" in repr(event)
    assert "'orders:42'" in str(event)
    fields = event.fields()
    assert fields["name"] == "orders:42"
    assert fields["resource"] == "orders:42"  # the log key kept for this release, documented as deprecated
    with pytest.warns(DeprecationWarning, match=r"LockEvent\.resource is deprecated .* use \.name"):
        assert event.resource == "orders:42"
    with pytest.warns(DeprecationWarning, match=r"LockEvent\(resource=\) is deprecated .* use name="):
        old = LockEvent(EventKind.RELEASED, resource="orders:42", held_for=0.5)
    assert old == event
    with pytest.raises(TypeError, match=r"LockEvent\(\) needs a name"):
        LockEvent(EventKind.RELEASED)


def test_states_are_literal_types_of_their_values() -> None:
    assert set(get_args(LockPhase)) == {phase.value for phase in Phase}
    assert get_args(LockState) == ("held", "free", "unknown")
    assert get_args(NodeState) == ("held", "free", "unreachable", "quarantined")
    for name in ("LockPhase", "LockState", "NodeState"):
        assert name in redlock_async.__all__


async def test_campaign_takes_timeout_by_keyword(redlock: Redlock) -> None:
    election = redlock.election("vocab:leader")
    with pytest.warns(
        DeprecationWarning, match=r"campaign\(seconds\) .* is deprecated .* use campaign\(timeout="
    ) as told:
        campaign = election.campaign(5)  # type: ignore[call-arg]
    assert told[0].filename == __file__
    async with campaign as term:
        assert term > 0
    with pytest.raises(TypeError, match=r"write campaign\(timeout=seconds\)"):
        election.campaign(5, timeout=5)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"write campaign\(timeout=seconds\)"):
        election.campaign(1, 2)  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match="campaign"), pytest.raises(ValueError, match="timeout"):
        async with election.campaign(-1):  # type: ignore[call-arg]
            pytest.fail("campaigned with a negative timeout")
    async with election.campaign(timeout=5) as later:
        assert later > term


def test_sync_campaign_takes_timeout_by_keyword(cluster: Cluster) -> None:
    with SyncRedlock(cluster.urls, ttl=1.0) as redlock:
        election = redlock.election("vocab:sync-leader")
        with pytest.warns(DeprecationWarning, match=r"use campaign\(timeout=seconds\)"):
            campaign = election.campaign(5)  # type: ignore[call-arg]
        with campaign as term:
            assert term > 0
        with pytest.raises(TypeError, match=r"write campaign\(timeout=seconds\)"):
            election.campaign(5, timeout=5)  # type: ignore[misc]
        assert redlock.lock("vocab:sync").name == "vocab:sync"


def test_max_queued_and_node_queued_are_old_spellings() -> None:
    """ "Queue" is the grant queue alone: a node's unanswered commands are ``unanswered``."""
    with pytest.warns(
        DeprecationWarning, match=r"Redlock\(max_queued=\) is deprecated .* use Redlock\(max_unanswered=\)"
    ) as told:
        redlock = Redlock([URL], max_queued=8)
    assert told[0].filename == __file__
    assert redlock.settings.max_unanswered == 8
    assert Redlock([URL], max_unanswered=9).settings.max_unanswered == 9
    with pytest.warns(DeprecationWarning, match=r"Settings\.max_queued is deprecated .* use \.max_unanswered"):
        assert redlock.settings.max_queued == 8
    node = redlock.statistics().nodes[0]
    assert node.unanswered == 0
    with pytest.warns(DeprecationWarning, match=r"NodeStatistics\.queued is deprecated .* use \.unanswered"):
        assert node.queued == 0
