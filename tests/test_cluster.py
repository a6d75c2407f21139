"""_cluster without servers: what the locks of one Redlock share (fake nodes, a real Listener)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from redlock_async._core import _clock
from redlock_async._core._settings import Settings
from redlock_async._shared._cluster import Cluster
from redlock_async._shared._handoff import Listener
from redlock_async.errors import RedlockError

from .fakes import as_nodes, fake_nodes, virtual


def cluster(**settings: Any) -> Cluster:
    nodes = tuple(as_nodes(fake_nodes(3)))
    return Cluster(nodes, Settings(**settings), Listener(0.05, scope=("test-cluster",)), None)


async def test_the_quarantine_period_follows_the_largest_ttl_granted_plus_its_drift() -> None:
    made = cluster(ttl=10.0, drift_factor=0.01)
    assert made.quarantine_period() == pytest.approx(10.0 + 10.0 * 0.01 + 0.002)  # the Redlock's own ttl first
    made.lease_settings(made.settings, ttl=30.0)
    made.lease_settings(made.settings, ttl=5.0)  # a shorter one later changes nothing
    assert made.quarantine_period() == pytest.approx(30.0 + 30.0 * 0.01 + 0.002)
    assert cluster(restart_quarantine=2.5).quarantine_period() == 2.5  # the setting, when given
    await made.watchdog.aclose()


def test_a_failed_background_task_ends_waits_at_once_and_every_later_call_says_so() -> None:
    async def test() -> None:
        made = cluster(ttl=10.0)
        made.check_open()
        began = _clock.now()
        pause = asyncio.create_task(made.pause(5.0))
        await asyncio.sleep(0.1)
        made.failed(RuntimeError("boom"))
        await pause
        assert _clock.now() - began == pytest.approx(0.1)  # woken then, not at its 5 s (virtual time)
        with pytest.raises(RedlockError, match=r"internal error.*RuntimeError: boom"):
            made.check_open()
        await made.watchdog.aclose()

    virtual(test)


async def test_a_closed_cluster_refuses_new_locks() -> None:
    made = cluster(ttl=10.0)
    made.closed = True
    with pytest.raises(RuntimeError, match="closed: make a new one"):
        made.check_open()
    await made.watchdog.aclose()


def test_without_a_running_loop_the_error_says_how_to_run_it() -> None:
    with pytest.raises(RuntimeError, match="needs a running asyncio event loop"):
        cluster(ttl=10.0).check_open()
