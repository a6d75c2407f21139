"""FastAPI: routes that run under a distributed lock named after a path parameter.

    REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,... uvicorn examples.fastapi_app:app

The ``Redlock`` lives as long as the app: the lifespan connects it to the
nodes in ``$REDLOCK_NODES`` (comma-separated URLs, as for the ``redlock``
command) and closes it on shutdown. ``locked("jobs:{job_id}")`` is a
dependency that holds the lock on that resource, filled in from the path
parameters, while the route runs; every process of the app, on any machine,
shares the lock through the nodes. Two behaviours:

* fail fast, ``locked(..., wait=0)``: a single try. When the lock is held,
  the route answers 409 Conflict at once and its body does not run.
  ``POST /jobs/{job_id}/run`` starts a job unless it is running already.
* waiting, ``locked(..., wait=seconds)``: the request queues for the lock
  (woken by the holder's release) and answers 409 only if the time runs out.
  ``POST /reports/{report_id}/build`` rebuilds a report, one build at a time.

When too few nodes can vote (down, a wrong password, in restart quarantine),
the lock is not busy but unavailable: the route answers 503 Service Unavailable
(``NodesUnavailable``), with ``Retry-After`` when a restart quarantine says how
long, and its body does not run. A 409 always means another request holds it.
The app starts even with fewer than a majority of nodes up (they may come up
later): the library logs a WARNING per node it cannot reach, and one saying no
lock can be granted until a majority is up; the routes answer 503 meanwhile.

While the route runs, the lock's watchdog extends the lease. If the lease is
lost all the same (the nodes lost the key, the event loop stalled past the
ttl), the route is cancelled and answers 503: its work may be half done.

The dependency uses ``scope="function"``: the lock is released as soon as
the route returns, not after the response has been sent, and a lost lease
can still turn into a 503.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, status

from redlock_async import Lock, LockLost, LockNotAcquired, NodesUnavailable, Redlock

Work = Callable[[Lock], Awaitable[None]]
"""What runs under the lock, given the held lock: put your job here."""


def node_urls() -> list[str]:
    urls = [url.strip() for url in os.environ.get("REDLOCK_NODES", "").split(",") if url.strip()]
    if not urls:
        raise RuntimeError("set REDLOCK_NODES to the Redis masters' URLs, comma-separated (3 or 5 of them)")
    return urls


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Redlock(node_urls()) as redlock:
        app.state.redlock = redlock
        yield


def locked(resource: str, *, wait: float = 0.0, ttl: float = 10.0) -> Any:
    """A dependency holding the lock on *resource* (a template of the path parameters) around the route.

    Answers 409 when the lock is still held by another request after *wait*
    seconds; 503 when too few nodes could vote, or when the lease is lost while the route runs.
    """

    async def hold(request: Request) -> AsyncIterator[Lock]:
        name = resource.format_map(request.path_params)
        redlock: Redlock = request.app.state.redlock
        try:
            async with redlock.lock(name, ttl=ttl, acquire_timeout=wait) as lock:
                yield lock
        except NodesUnavailable as exc:  # (a LockNotAcquired: caught first) not held elsewhere: no quorum
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"{name}: the lock service is unavailable (too few nodes can vote): try again later",
                headers=retry_after(exc),
            ) from None
        except LockNotAcquired:
            raise HTTPException(status.HTTP_409_CONFLICT, f"{name} is busy: try again later") from None
        except LockLost:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"lost the lock on {name}: retry") from None

    return Depends(hold, scope="function")


def retry_after(exc: NodesUnavailable) -> dict[str, str] | None:
    """A Retry-After header when the nodes say when a majority can vote again (a restart quarantine)."""
    return None if exc.retry_after is None else {"Retry-After": str(math.ceil(exc.retry_after))}


async def simulated_work(lock: Lock) -> None:
    await asyncio.sleep(0.5)


def create_app(work: Work = simulated_work) -> FastAPI:
    app = FastAPI(lifespan=lifespan)

    @app.post("/jobs/{job_id}/run")
    async def run_job(job_id: str, lock: Annotated[Lock, locked("jobs:{job_id}")]) -> dict[str, str]:
        await work(lock)
        return {"job": job_id, "status": "done"}

    @app.post("/reports/{report_id}/build")
    async def build_report(
        report_id: str, lock: Annotated[Lock, locked("reports:{report_id}", wait=10.0)]
    ) -> dict[str, str]:
        await work(lock)
        return {"report": report_id, "status": "built"}

    return app


app = create_app()
