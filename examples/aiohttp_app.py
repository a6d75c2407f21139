"""aiohttp: handlers that run under a distributed lock named after a path parameter.

    REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,... python examples/aiohttp_app.py

It serves on 127.0.0.1:8080; ``--host`` and ``--port`` change that. Two
replicas on one machine, sharing the locks through the nodes::

    python examples/aiohttp_app.py --port 8081 &
    python examples/aiohttp_app.py --port 8082 &

or through aiohttp's own runner, whose ``-H``/``-P`` set the address (it calls
``main`` with the arguments it did not take itself)::

    python -m aiohttp.web -H 127.0.0.1 -P 8081 examples.aiohttp_app:main

The ``Redlock`` lives as long as the app: a ``cleanup_ctx`` connects it to
the nodes in ``$REDLOCK_NODES`` (comma-separated URLs, as for the
``redlock`` command) on startup and closes it on cleanup.
``@locked("jobs:{job_id}")`` wraps a handler so that it runs while holding
the lock on that resource, filled in from the route's match info; every
process of the app, on any machine, shares the lock through the nodes. Two
behaviours:

* fail fast, ``@locked(..., wait=0)``: a single try. When the lock is held,
  the handler answers 409 Conflict at once without running.
  ``POST /jobs/{job_id}/run`` starts a job unless it is running already.
* waiting, ``@locked(..., wait=seconds)``: the request queues for the lock
  (woken by the holder's release) and answers 409 only if the time runs out.
  ``POST /reports/{report_id}/build`` rebuilds a report, one build at a time.

When too few nodes can vote (down, a wrong password, in restart quarantine),
the lock is not busy but unavailable: the handler answers 503 Service Unavailable
(``NodesUnavailable``), with ``Retry-After`` when a restart quarantine says how
long, and does not run. A 409 always means another request holds it.

While the handler runs, the lock's watchdog extends the lease. If the lease
is lost all the same (the nodes lost the key, the event loop stalled past
the ttl), the handler is cancelled and answers 503: its work may be half done.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from redlock_async import Lock, LockLost, LockNotAcquired, NodesUnavailable, Redlock

Work = Callable[[Lock], Awaitable[None]]
"""What runs under the lock, given the held lock: put your job here."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LockedHandler = Callable[[web.Request, Lock], Awaitable[web.StreamResponse]]

REDLOCK = web.AppKey("redlock", Redlock)


def node_urls() -> list[str]:
    urls = [url.strip() for url in os.environ.get("REDLOCK_NODES", "").split(",") if url.strip()]
    if not urls:
        raise RuntimeError("set REDLOCK_NODES to the Redis masters' URLs, comma-separated (3 or 5 of them)")
    return urls


async def redlock_ctx(app: web.Application) -> AsyncIterator[None]:
    async with Redlock(node_urls()) as redlock:
        app[REDLOCK] = redlock
        yield


def locked(resource: str, *, wait: float = 0.0, ttl: float = 10.0) -> Callable[[LockedHandler], Handler]:
    """Run the handler holding the lock on *resource* (a template of the match info); it gets the lock too.

    Answers 409 when the lock is still held by another request after *wait*
    seconds; 503 when too few nodes could vote, or when the lease is lost while the handler runs.
    """

    def decorate(handler: LockedHandler) -> Handler:
        @functools.wraps(handler)
        async def guarded(request: web.Request) -> web.StreamResponse:
            name = resource.format_map(request.match_info)
            try:
                async with request.app[REDLOCK].lock(name, ttl=ttl, acquire_timeout=wait) as lock:
                    return await handler(request, lock)
            except NodesUnavailable as exc:  # (a LockNotAcquired: caught first) not held elsewhere: no quorum
                headers = None if exc.retry_after is None else {"Retry-After": str(math.ceil(exc.retry_after))}
                raise web.HTTPServiceUnavailable(
                    text=f"{name}: the lock service is unavailable (too few nodes can vote): try again later",
                    headers=headers,
                ) from None
            except LockNotAcquired:
                raise web.HTTPConflict(text=f"{name} is busy: try again later") from None
            except LockLost:
                raise web.HTTPServiceUnavailable(text=f"lost the lock on {name}: retry") from None

        return guarded

    return decorate


async def simulated_work(lock: Lock) -> None:
    await asyncio.sleep(0.5)


def create_app(work: Work = simulated_work) -> web.Application:
    @locked("jobs:{job_id}")
    async def run_job(request: web.Request, lock: Lock) -> web.StreamResponse:
        await work(lock)
        return web.json_response({"job": request.match_info["job_id"], "status": "done"})

    @locked("reports:{report_id}", wait=10.0)
    async def build_report(request: web.Request, lock: Lock) -> web.StreamResponse:
        await work(lock)
        return web.json_response({"report": request.match_info["report_id"], "status": "built"})

    app = web.Application()
    app.cleanup_ctx.append(redlock_ctx)
    app.router.add_post("/jobs/{job_id}/run", run_job)
    app.router.add_post("/reports/{report_id}/build", build_report)
    return app


def main(argv: list[str]) -> web.Application:
    """The app for ``python -m aiohttp.web ... examples.aiohttp_app:main``; *argv* is what aiohttp's
    runner did not take (its -H and -P set the address): this app takes nothing more."""
    if argv:
        raise SystemExit(f"aiohttp_app takes no arguments of its own, got {' '.join(argv)}: use -H HOST -P PORT")
    return create_app()


def serve(argv: list[str] | None = None) -> None:
    """``python examples/aiohttp_app.py [--host HOST] [--port PORT]``: loopback, port 8080 by default."""
    parser = argparse.ArgumentParser(description="The aiohttp example app: handlers under distributed locks.")
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="the port to serve on (default: 8080)")
    args = parser.parse_args(argv)
    web.run_app(create_app(), host=args.host, port=args.port)


if __name__ == "__main__":
    serve()
