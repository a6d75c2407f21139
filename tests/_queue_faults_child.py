"""The other OS process of tests/test_queue_faults.py (the grant queue's second round of attacks).

``python -m tests._queue_faults_child contend URLS NAME SECONDS TASKS RETRY_DELAY BOUND``
    *TASKS* tasks of one ``queue=True`` Redlock take *NAME* (acquire timeout *BOUND*) for *SECONDS*.
    Prints ``{"ready": t}`` once connected, then at the end one line per critical section,
    ``[client, token, start, end, waited]`` (monotonic seconds: the clock is the same for every
    process of the machine), and last ``{"timeouts": n}``.

``python -m tests._queue_faults_child term URLS NAME MODE HANDLE TTL``
    *MODE* ``hold``: take *NAME* (ttl *TTL*) inside ``async with`` and sit in the body;
    ``wait``: queue for *NAME* (blocking, no time limit of note). With *HANDLE* ``1``, SIGTERM
    cancels the main task (the usual asyncio way: ``async with`` releases or leaves the line on the
    way out, the Redlock closes); with ``0``, SIGTERM kills the process as it does by default.
    Prints ``{"started": t}``, then ``{"held": t, "token": ..., "valid_until": t}`` (hold) or
    ``{"waiting": t}`` (wait), and, when SIGTERM was handled, ``{"cancelled": t}`` once the Redlock
    is closed; exits 0 then.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from redlock_async import LockNotAcquired, Redlock


def say(event: Any) -> None:
    print(json.dumps(event), flush=True)


async def contend(urls: list[str], name: str, seconds: float, tasks: int, retry_delay: float, bound: float) -> None:
    rows: list[list[Any]] = []
    timeouts = 0
    async with Redlock(urls, retry_delay=retry_delay, queue=True) as redlock:
        say({"ready": time.monotonic()})
        stop = time.monotonic() + seconds

        async def task(n: int) -> None:
            nonlocal timeouts
            lock = redlock.lock(name, acquire_timeout=bound)
            while time.monotonic() < stop:
                wanted = time.monotonic()
                try:
                    async with lock:
                        start = time.monotonic()
                        await asyncio.sleep(0.0005)
                        rows.append([f"pid{os.getpid()}.{n}", lock.token, start, time.monotonic(), start - wanted])
                except LockNotAcquired:
                    timeouts += 1
                await asyncio.sleep(0.001)

        await asyncio.gather(*(task(n) for n in range(tasks)))
    for row in rows:
        say(row)
    say({"timeouts": timeouts})


async def term(urls: list[str], name: str, mode: str, handle: bool, ttl: float) -> None:
    main = asyncio.current_task()
    assert main is not None
    if handle:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        async with Redlock(urls, queue=True, retry_delay=0.2) as redlock:
            say({"started": time.monotonic()})
            lock = redlock.lock(name, ttl=ttl, acquire_timeout=120)
            if mode == "wait":
                say({"waiting": time.monotonic()})
            async with lock:
                say({"held": time.monotonic(), "token": lock.token, "valid_until": time.monotonic() + lock.validity})
                await asyncio.sleep(120)
    except asyncio.CancelledError:
        say({"cancelled": time.monotonic()})


def main(argv: list[str]) -> None:
    mode, urls = argv[0], argv[1].split(",")
    if mode == "contend":
        asyncio.run(contend(urls, argv[2], float(argv[3]), int(argv[4]), float(argv[5]), float(argv[6])))
    elif mode == "term":
        asyncio.run(term(urls, argv[2], argv[3], argv[4] == "1", float(argv[5])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
