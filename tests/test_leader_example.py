"""examples/leader.py, run for real: replicas of the FastAPI app (each with its lifespan, through ASGI)
on the 5 nodes of ``cluster`` elect one scheduler, hand it over on shutdown, and campaign again
after a lost lease.

A witness scheduler records which terms ran and how many schedulers ran at once (at most one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from examples import leader
from redlock_async import Redlock

from .conftest import Cluster, assert_no_library_tasks, eventually, holders

ROOT = Path(__file__).parent.parent
"""The repository: examples/ is imported from it."""
HANDOFF = 1.0
"""Longest wait allowed between the leader's shutdown and the next replica leading."""


class Witness:
    """The scheduler of every replica: records the terms run, and how many run at once."""

    def __init__(self) -> None:
        self.running: set[int] = set()
        self.started: list[int] = []
        self.cancelled: list[int] = []
        self.most = 0

    async def run(self, term: int) -> None:
        self.running.add(term)
        self.started.append(term)
        self.most = max(self.most, len(self.running))
        try:
            await asyncio.Event().wait()  # a scheduler runs for as long as its replica leads
        except asyncio.CancelledError:
            self.cancelled.append(term)
            raise
        finally:
            self.running.discard(term)


@pytest.fixture
def nodes_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app reads its nodes from $REDLOCK_NODES, like examples/fastapi_app.py."""
    monkeypatch.setenv("REDLOCK_NODES", ",".join(cluster.urls))


@contextlib.asynccontextmanager
async def replica(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """One replica: *app* with its lifespan run (the Redlock made, the campaign started), and a client."""
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://replica") as client,
    ):
        yield client


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/status")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def leader_of(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/leader")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def wait_leading(*clients: httpx.AsyncClient, within: float) -> list[dict[str, Any]]:
    """Poll every replica's /status until one leads; returns the statuses."""
    deadline = time.monotonic() + within
    while True:
        statuses = [await status(client) for client in clients]
        if any(s["leading"] for s in statuses):
            return statuses
        assert time.monotonic() < deadline, f"no replica leads after {within} s: {statuses}"
        await asyncio.sleep(0.01)


@pytest.mark.serial
@pytest.mark.usefixtures("nodes_env")
async def test_two_replicas_elect_one_and_hand_over_when_it_shuts_down(cluster: Cluster) -> None:
    witness = Witness()
    # A 2 s retry delay: a hand-off within HANDOFF was pushed by the resignation, not found by a retry.
    apps = {name: leader.create_app(witness.run, owner=name, retry_delay=2.0) for name in ("replica-a", "replica-b")}
    stacks = {name: contextlib.AsyncExitStack() for name in apps}
    try:
        clients = {name: await stacks[name].enter_async_context(replica(app)) for name, app in apps.items()}
        statuses = await wait_leading(*clients.values(), within=5.0)
        await asyncio.sleep(0.3)  # the other replica has campaigned meanwhile, and waits
        statuses = [await status(client) for client in clients.values()]
        leaders = [s for s in statuses if s["leading"]]
        assert len(leaders) == 1, statuses
        first = leaders[0]
        standby = next(name for name in apps if name != first["owner"])
        assert isinstance(first["term"], int)
        assert await status(clients[standby]) == {"owner": standby, "leading": False, "term": None}
        for client in clients.values():  # every replica says the same about who leads
            assert await leader_of(client) == {"state": "held", "owner": first["owner"], "term": first["term"]}
        assert witness.running == {first["term"]}

        stopping = time.monotonic()
        await stacks.pop(first["owner"]).aclose()  # the leader's lifespan ends: it resigns
        [second] = await wait_leading(clients[standby], within=HANDOFF)
        handed_over = time.monotonic() - stopping
        assert handed_over < HANDOFF, handed_over
        assert second["owner"] == standby
        assert second["term"] > first["term"]
        assert await leader_of(clients[standby]) == {"state": "held", "owner": standby, "term": second["term"]}
        assert witness.started == [first["term"], second["term"]]
        assert witness.cancelled == [first["term"]]  # the old leader's scheduler was stopped on shutdown
        assert witness.most == 1  # never two schedulers at once
    finally:
        for stack in stacks.values():
            await stack.aclose()
    assert witness.running == set()
    assert_no_library_tasks()
    # The last leader resigned on shutdown too: no lease is left on any node.
    assert await eventually(lambda: holders(cluster, leader.ELECTION) == [], 1.0)


@pytest.mark.serial
@pytest.mark.usefixtures("nodes_env")
async def test_a_replica_waits_while_another_leads_and_shuts_down_cleanly(cluster: Cluster) -> None:
    witness = Witness()
    async with Redlock(cluster.urls) as outside, contextlib.AsyncExitStack() as stack:
        elsewhere = outside.election(leader.ELECTION, owner="elsewhere")
        resign = contextlib.AsyncExitStack()
        stack.push_async_callback(resign.aclose)  # closed last, should the test fail before it resigns
        term = await resign.enter_async_context(elsewhere.campaign())
        async with replica(leader.create_app(witness.run, owner="waiting")) as client:
            await asyncio.sleep(0.3)
            assert await status(client) == {"owner": "waiting", "leading": False, "term": None}
            assert await leader_of(client) == {"state": "held", "owner": "elsewhere", "term": term}
        assert campaigns() == []  # the waiting campaign ended with its lifespan...
        assert (await elsewhere.leader()).owner == "elsewhere"  # ...having taken nothing

        client = await stack.enter_async_context(replica(leader.create_app(witness.run, owner="next", retry_delay=2.0)))
        await asyncio.sleep(0.3)
        assert not (await status(client))["leading"]
        resigned = time.monotonic()
        await resign.aclose()
        [now] = await wait_leading(client, within=HANDOFF)
        assert time.monotonic() - resigned < HANDOFF
        assert now["term"] > term
        assert await leader_of(client) == {"state": "held", "owner": "next", "term": now["term"]}
    assert witness.started == [now["term"]]
    assert witness.running == set()
    assert_no_library_tasks()


def campaigns() -> list[str]:
    """The example's campaign tasks still running (it names them)."""
    return sorted(
        name
        for task in asyncio.all_tasks()
        if not task.done() and (name := task.get_name()).startswith(f"campaign {leader.ELECTION}")
    )


@pytest.mark.usefixtures("nodes_env")
async def test_a_leader_that_loses_its_lease_campaigns_again(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLICA", "solo")  # the replica's label, when create_app is given none
    witness = Witness()
    app = leader.create_app(witness.run, ttl=1.0)
    async with replica(app) as client:
        [first] = await wait_leading(client, within=5.0)
        # The nodes lose the leader's key (fencing counters stay): the next extension is refused.
        for i in range(len(cluster)):
            cluster[i].command("DEL", f"redlock:{leader.ELECTION}")
        deadline = time.monotonic() + 5.0
        while len(witness.started) < 2:
            assert time.monotonic() < deadline, witness.started
            await asyncio.sleep(0.01)
        assert witness.cancelled == [first["term"]]  # its scheduler was cancelled (LockLost)...
        [again] = await wait_leading(client, within=1.0)  # ...and it campaigned again, and leads
        assert again["term"] > first["term"]
        assert await leader_of(client) == {"state": "held", "owner": "solo", "term": again["term"]}
        assert app.state.replica.terms == [first["term"], again["term"]]
        assert witness.most == 1
    assert_no_library_tasks()


UNDER_UVICORN = """
import asyncio, logging
from asgi_lifespan import LifespanManager
from examples import leader

logging.getLogger("uvicorn").addHandler(logging.StreamHandler())  # uvicorn configures its own loggers only

async def main():
    app = leader.create_app(owner="solo")
    async with LifespanManager(app):
        for _ in range(200):
            if app.state.replica.term is not None:
                break
            await asyncio.sleep(0.05)

asyncio.run(main())
"""


def test_the_replica_says_who_leads_when_nothing_configured_logging(cluster: Cluster) -> None:
    """Under uvicorn only its loggers are configured: the example's INFO lines (who leads, the ticks) were lost."""
    result = subprocess.run(
        [sys.executable, "-c", UNDER_UVICORN],
        env={**os.environ, "REDLOCK_NODES": ",".join(cluster.urls), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"INFO +examples\.leader: solo leads \(term [0-9]+\)", result.stderr), result.stderr
    assert "scheduler tick (term" in result.stderr
