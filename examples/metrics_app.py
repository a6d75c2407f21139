"""FastAPI with lock metrics: Prometheus scrapes ``/metrics``, Grafana draws examples/grafana-dashboard.json.

    pip install 'redlock_async[prometheus]' fastapi uvicorn
    REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,... uvicorn examples.metrics_app:app

``Prometheus()`` is passed as the Redlock's ``on_event``: every acquire, extension, release
and loss of its locks becomes a measurement (docs/metrics.md lists them). ``/metrics`` is
``prometheus_client``'s own ASGI app, mounted on the FastAPI app, serving the registry the
adapter registered in. Lock names are no label by default; here ``name_attribute`` maps each
name to its prefix (``jobs:7`` -> ``jobs``), a label with a handful of values.

``POST /jobs/{job_id}/run`` runs a job under the lock ``jobs:{job_id}``, waiting up to 10 s
for it (woken by the holder's release: the hand-off latency is measured too), and answers
409 when it could not get it in time. A list passed as ``on_event`` lets logs, metrics and
your own hook listen at once: ``on_event=[metrics, my_hook]``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, status
from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app

from redlock_async import Lock, LockNotAcquired, Redlock
from redlock_async.metrics import Prometheus

Work = Callable[[Lock], Awaitable[None]]


def node_urls() -> list[str]:
    urls = [url.strip() for url in os.environ.get("REDLOCK_NODES", "").split(",") if url.strip()]
    if not urls:
        raise RuntimeError("set REDLOCK_NODES to the Redis masters' URLs, comma-separated (3 or 5 of them)")
    return urls


def prefix(name: str) -> str:
    """A lock's group for the metrics: its name up to the first colon (``jobs:7`` -> ``jobs``)."""
    return name.split(":", 1)[0]


async def simulated_work(lock: Lock) -> None:
    await asyncio.sleep(0.2)


def create_app(work: Work = simulated_work, registry: CollectorRegistry = REGISTRY) -> FastAPI:
    """The app, its lock metrics in *registry* (one app per registry: the metrics register once)."""
    metrics = Prometheus(registry=registry, name_attribute=prefix)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Redlock(node_urls(), on_event=metrics) as redlock:
            app.state.redlock = redlock
            yield

    app = FastAPI(lifespan=lifespan)
    app.mount("/metrics", make_asgi_app(registry))

    @app.post("/jobs/{job_id}/run")
    async def run_job(job_id: str) -> dict[str, str]:
        redlock: Redlock = app.state.redlock
        try:
            async with redlock.lock(f"jobs:{job_id}", acquire_timeout=10.0) as lock:
                await work(lock)
        except LockNotAcquired:
            raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is busy: try again later") from None
        return {"job": job_id, "status": "done"}

    return app


app = create_app()
