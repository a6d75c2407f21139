"""Events for logs and metrics: what each one carries, the lost lock's above all."""

from __future__ import annotations

import asyncio
import logging

import pytest

from redlock_async import EventKind, LockEvent, LockLost, Vote

from .conftest import Cluster, MakeRedlock


@pytest.mark.serial
async def test_a_lost_lock_is_told_by_event_and_by_a_warning_with_fields(
    cluster: Cluster, make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=events.append)
    caplog.set_level(logging.WARNING, logger="redlock_async")
    with pytest.raises(LockLost):
        async with redlock.lock("doomed", ttl=0.5):
            cluster.flush()  # every key gone: the next extension is refused by every node
            await asyncio.sleep(2.0)
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.ACQUIRED
    assert kinds[-1] is EventKind.LOST
    lost = events[-1]
    assert lost.name == "doomed"
    assert lost.watchdog
    assert "gone from a majority" in lost.reason
    assert [o.vote for o in lost.outcomes].count(Vote.NO) >= 3
    assert lost.held_for is not None
    assert 0.2 < lost.held_for < 1.0
    records = [r for r in caplog.records if getattr(r, "redlock", {}).get("event") == "lost"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    fields = records[0].redlock  # type: ignore[attr-defined]
    assert fields["name"] == fields["resource"] == "doomed"
    assert fields["watchdog"] is True
    assert list(fields["votes"].values()).count("no") >= 3


async def test_acquire_extend_release_events_carry_latency_margin_and_hold_time(make_redlock: MakeRedlock) -> None:
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=events.append)
    lock = redlock.lock("metered", ttl=1.0, fencing=True)
    assert await lock.acquire()
    await lock.extend()
    await asyncio.sleep(0.05)
    await lock.release()
    acquired, extended, released = events
    assert acquired.kind is EventKind.ACQUIRED
    assert acquired.attempts == 1
    assert acquired.duration is not None
    assert 0 < acquired.duration < 0.5
    assert acquired.validity is not None
    assert 0.9 < acquired.validity < 1.0
    assert acquired.fencing_token is not None
    assert acquired.fencing_token >= 1
    assert len(acquired.outcomes) == 5
    assert extended.kind is EventKind.EXTENDED
    assert not extended.watchdog
    assert extended.margin is not None
    assert 0.5 < extended.margin < 1.0
    assert released.kind is EventKind.RELEASED
    assert released.held_for is not None
    assert released.held_for >= 0.05


async def test_watchdog_extensions_report_how_late_they_ran(make_redlock: MakeRedlock) -> None:
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=events.append)
    async with redlock.lock("watched", ttl=0.5):
        await asyncio.sleep(0.8)
    extensions = [e for e in events if e.kind is EventKind.EXTENDED]
    assert extensions
    for event in extensions:
        assert event.watchdog
        assert event.late_by is not None
        assert 0 <= event.late_by < 0.1
        assert event.margin is not None
        assert event.margin > 0
    assert events[-1].kind is EventKind.RELEASED


async def test_a_failed_acquire_reports_its_attempts(make_redlock: MakeRedlock) -> None:
    events: list[LockEvent] = []
    holder_side, waiter_side = await make_redlock(), await make_redlock(on_event=events.append, retry_delay=0.02)
    holder = holder_side.lock("busy")
    assert await holder.acquire()
    assert not await waiter_side.lock("busy").acquire(timeout=0.3)
    await holder.release()
    (failed,) = events
    assert failed.kind is EventKind.NOT_ACQUIRED
    assert failed.attempts is not None
    assert failed.attempts >= 2
    assert failed.duration is not None
    assert failed.duration >= 0.3
    assert "no majority" in failed.reason


async def test_a_failing_callback_is_logged_and_changes_nothing(
    make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: LockEvent) -> None:
        raise RuntimeError("metrics backend down")

    redlock = await make_redlock(on_event=broken)
    async with redlock.lock("sturdy"):
        pass
    assert "on_event callback failed" in caplog.text


async def test_logs_are_quiet_at_info(make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="redlock_async")
    redlock = await make_redlock()
    async with redlock.lock("quiet"):
        pass
    assert [r for r in caplog.records if r.name.startswith("redlock_async")] == []
    caplog.set_level(logging.DEBUG, logger="redlock_async")
    async with redlock.lock("chatty"):
        pass
    told = [r.redlock["event"] for r in caplog.records if hasattr(r, "redlock")]
    assert told == ["acquired", "released"]


def test_on_event_must_be_callable() -> None:
    from redlock_async import Redlock

    with pytest.raises(TypeError, match="on_event must be a function"):
        Redlock(["redis://127.0.0.1:1"], on_event="print")  # type: ignore[arg-type]


def test_an_event_builds_its_outcomes_from_its_votes_on_first_read() -> None:
    nodes = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")
    votes = (Vote.YES, Vote.NO, Vote.TIMEOUT)
    event = LockEvent(EventKind.ACQUIRED, "lazy", grant=7, nodes=nodes, votes=votes, details=("", "held", ""))
    assert [(o.node, o.vote, o.detail) for o in event.outcomes] == [
        ("127.0.0.1:7001", Vote.YES, ""),
        ("127.0.0.1:7002", Vote.NO, "held"),
        ("127.0.0.1:7003", Vote.TIMEOUT, ""),
    ]
    assert event.outcomes is event.outcomes  # built once
    # Made from outcomes (as a user's test would), it has the same plain votes, and compares equal.
    same = LockEvent(EventKind.ACQUIRED, "lazy", outcomes=event.outcomes, grant=7)
    assert same.nodes == nodes
    assert same.votes == votes
    assert same == event
    assert same != LockEvent(EventKind.ACQUIRED, "lazy", outcomes=event.outcomes, grant=8)
    assert event.fields()["votes"] == {"127.0.0.1:7001": "yes", "127.0.0.1:7002": "no", "127.0.0.1:7003": "timeout"}
    assert "grant=7" in repr(event)
    assert "grant=7" in str(event)
    assert LockEvent(EventKind.RELEASED, "none").outcomes == ()
