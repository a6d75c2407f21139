"""A Celery app with a singleton task: two copies of the same report never run at once, on any worker.

The lock is the blocking API's (``redlock_async.sync``): a plain function decorated with
``redlock.synchronized``, whose name is filled from the task's arguments. ``blocking=False,
on_busy="skip"`` makes a second copy, sent while the first runs, return at once without running.
The watchdog keeps the lease while the task body runs, however long (``time.sleep`` here).

The Redlock is made at import, in the worker's main process, before Celery's prefork pool forks
its children: each child starts its own background loop and connections at its first task.

Run it against your nodes (the first one is the broker and result backend here; use your own)::

    REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 \\
        celery -A examples.celery_app worker --pool=prefork --concurrency=2

and send ``report.delay(42)`` twice at once. tests/test_celery_example.py does so against
embedded nodes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from redlock_async.sync import Redlock

NODES = [url.strip() for url in os.environ.get("REDLOCK_NODES", "redis://127.0.0.1:6379").split(",") if url.strip()]
BROKER = os.environ.get("CELERY_BROKER_URL", NODES[0])

app = Celery("celery_app", broker=BROKER, backend=BROKER)
app.conf.update(
    worker_prefetch_multiplier=1,  # each child takes one task at a time: two copies go to two children
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
)

redlock = Redlock(NODES, ttl=2.0)  # at import: each forked child makes its own loop and connections


@redlock.synchronized("report:{customer_id}", blocking=False, on_busy="skip")
def build_report(customer_id: int, seconds: float, journal: str) -> str:
    """The work: runs once at a time per customer, across every worker and machine."""
    with Path(journal).open("a") as out:
        out.write(f"start {customer_id} {os.getpid()} {time.monotonic()}\n")
    time.sleep(seconds)  # longer than the ttl: the watchdog extends the lease meanwhile
    with Path(journal).open("a") as out:
        out.write(f"end {customer_id} {os.getpid()} {time.monotonic()}\n")
    return f"report {customer_id}"


@app.task  # type: ignore[untyped-decorator]  # celery ships no type hints
def report(customer_id: int, seconds: float = 3.0, journal: str = os.devnull) -> dict[str, Any]:
    """Build the report unless a copy of it runs somewhere already."""
    result = build_report(customer_id, seconds, journal)
    return {"pid": os.getpid(), "ran": result is not None}
