"""FastAPI: the replicas of an app elect one of them to run the scheduler.

    REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,... REPLICA=10.0.0.5:8000 \\
        uvicorn examples.leader:app

Every replica campaigns for the election ``scheduler`` from its lifespan, in a
background task, for as long as it runs; one at a time leads, and runs the
scheduler with its term. The term is larger than every earlier leader's: tag
the scheduler's writes with it (``redlock_async.fenced_set``), so that a
leader that stalled past its lease and carries on cannot overwrite its
successor's work.

* A leader that shuts down resigns: another replica leads at once (the
  hand-off is pushed, not polled).
* A leader that dies is succeeded once its lease runs out (``ttl``).
* A leader that cannot keep its lease (a pause, a partition) has its
  scheduler cancelled (``LockLost``) and campaigns again.

``GET /leader`` says who leads, as the nodes say (any replica answers the
same); ``GET /status`` whether this replica leads, and its term. The replica's
label is ``$REPLICA`` (default ``<hostname>:<pid>``); the nodes are
``$REDLOCK_NODES`` (comma-separated URLs), as for examples/fastapi_app.py.

Who leads, the scheduler's ticks and the library's notices are logged at INFO.
uvicorn configures only its own loggers, so when nothing else configured
logging, the app sends these to stderr itself (:func:`show_logs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from redlock_async import LockLost, Redlock
from redlock_async.election import Election

log = logging.getLogger(__name__)

ELECTION = "scheduler"

Scheduler = Callable[[int], Awaitable[None]]
"""What the leader runs, given its term, for as long as it leads: put your periodic jobs here."""

RETRY_AFTER_ERROR = 1.0
"""Seconds before campaigning again after the scheduler failed."""


def show_logs() -> None:
    """Log this example's INFO lines (who leads, the ticks) and the library's to stderr, unless logging is
    configured already: under uvicorn, only its own loggers are, and INFO would go unseen."""
    if log.hasHandlers():
        return  # the app (or a --log-config) configured it: leave it alone
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-9s %(name)s: %(message)s"))
    for name in (__name__, "redlock_async"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def node_urls() -> list[str]:
    urls = [url.strip() for url in os.environ.get("REDLOCK_NODES", "").split(",") if url.strip()]
    if not urls:
        raise RuntimeError("set REDLOCK_NODES to the Redis masters' URLs, comma-separated (3 or 5 of them)")
    return urls


async def run_scheduler(term: int) -> None:
    """The leader's work: a tick every few seconds, tagged with the term (never returns)."""
    while True:
        log.info("scheduler tick (term %d)", term)
        await asyncio.sleep(5.0)


class Replica:
    """This replica's side of the election: whether it leads now, and its term."""

    def __init__(self, election: Election, owner: str, scheduler: Scheduler) -> None:
        self.election = election
        self.owner = owner
        self.scheduler = scheduler
        self.term: int | None = None
        """The term while this replica leads, None otherwise."""
        self.terms: list[int] = []
        """Every term this replica led, in order."""

    async def campaign_forever(self) -> None:
        """Lead whenever the election says so; after a lost lease or a failed scheduler, campaign again."""
        while True:
            try:
                async with self.election.campaign() as term:
                    self.term = term
                    self.terms.append(term)
                    log.info("%s leads (term %d)", self.owner, term)
                    try:
                        await self.scheduler(term)
                    finally:
                        self.term = None
            except LockLost as exc:
                log.warning("%s lost the leadership: %s", self.owner, exc)
                continue
            except Exception:
                log.exception("%s: the scheduler failed; resigned, campaigning again", self.owner)
                await asyncio.sleep(RETRY_AFTER_ERROR)


def create_app(
    scheduler: Scheduler = run_scheduler,
    *,
    owner: str | None = None,
    ttl: float = 10.0,
    **settings: Any,
) -> FastAPI:
    """The app; *owner* labels this replica (default ``$REPLICA``, else ``<hostname>:<pid>``), *ttl* is
    the leader's lease (how long a dead leader goes unreplaced), *settings* go to the Redlock."""
    label = owner or os.environ.get("REPLICA") or f"{socket.gethostname()}:{os.getpid()}"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        show_logs()
        async with Redlock(node_urls(), **settings) as redlock:
            replica = Replica(redlock.election(ELECTION, owner=label, ttl=ttl), label, scheduler)
            app.state.replica = replica
            task = asyncio.create_task(replica.campaign_forever(), name=f"campaign {ELECTION} as {label}")
            try:
                yield
            finally:
                # Resign (or stop waiting) before the Redlock closes: the next replica leads at once.
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(lifespan=lifespan)

    @app.get("/leader")
    async def leader(request: Request) -> dict[str, Any]:
        replica: Replica = request.app.state.replica
        info = await replica.election.leader()
        return {
            "state": info.state,
            "owner": info.owner,
            "term": info.fencing_counter if info.state == "held" else None,
        }

    @app.get("/status")
    async def status(request: Request) -> dict[str, Any]:
        replica: Replica = request.app.state.replica
        return {"owner": replica.owner, "leading": replica.term is not None, "term": replica.term}

    return app


app = create_app()
