"""_emitter without servers: a lock's events are made only when heard, carry the grant and the votes,
and a failing on_event hook is logged, never raised into the lock."""

from __future__ import annotations

import logging

import pytest

from redlock_async._core._algorithm import Vote
from redlock_async._lock._emitter import emit, emit_lost, heard
from redlock_async._rounds._lease import Lease
from redlock_async.events import EventKind, LockEvent

from .parts import parts


async def test_no_event_is_made_when_no_one_listens(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="redlock_async")
    p = parts()
    assert not heard(p.cluster, EventKind.ACQUIRED)  # DEBUG is off, no hook
    assert heard(p.cluster, EventKind.LOST)  # a loss is a WARNING
    emit(p.cluster, p.tenure, EventKind.ACQUIRED, duration=0.0, attempts=1)
    assert caplog.records == []
    await p.cluster.watchdog.aclose()


async def test_an_event_carries_the_grant_and_the_last_votes() -> None:
    p = parts()
    seen: list[LockEvent] = []
    p.cluster.on_event = seen.append
    p.tenure.lease = Lease((b"k",), b"token", acquired_at=0.0)
    p.tenure.votes = [Vote.YES, Vote.YES, Vote.YES, Vote.NO, Vote.PENDING]
    assert heard(p.cluster, EventKind.ACQUIRED)
    emit(p.cluster, p.tenure, EventKind.ACQUIRED, duration=0.01, attempts=1)
    emit(p.cluster, p.tenure, EventKind.NOT_ACQUIRED, duration=0.01, attempts=1, reason="busy")
    acquired, refused = seen
    assert (acquired.kind, acquired.grant) == (EventKind.ACQUIRED, p.tenure.lease.serial)
    assert refused.grant is None  # no grant to name
    assert acquired.votes == tuple(p.tenure.votes)
    assert acquired.nodes == p.cluster.names
    await p.cluster.watchdog.aclose()


async def test_a_failing_hook_is_logged_and_the_lock_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    p = parts()

    def broken(event: LockEvent) -> None:
        raise RuntimeError("hook broke")

    p.cluster.on_event = broken
    emit_lost(p.cluster, p.tenure, "lost for a test", watchdog=True)  # does not raise
    assert "on_event callback failed" in caplog.text
    assert "lost for a test" in caplog.text  # the WARNING of the loss itself
    await p.cluster.watchdog.aclose()
