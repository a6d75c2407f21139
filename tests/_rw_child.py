"""A reader/writer process for tests/test_rw_lock.py.

usage: python -m tests._rw_child hold NAME TTL URL [URL ...]
       python -m tests._rw_child mix NAME SECONDS URL [URL ...]
       python -m tests._rw_child read|write NAME SECONDS URL [URL ...]

``hold``: takes read/write lock NAME as a reader and never lets go: prints one JSON line once it holds
it ({"held": true, "validity": ...}), then keeps it (the watchdog extends it) until the test kills it.

``mix``: for SECONDS, 4 reader tasks and 1 writer task take NAME again and again; prints one JSON line
per critical section ({"client", "token", "fencing", "start", "end", "shared"}: monotonic seconds,
system-wide on Linux), for the test to merge into one History with its own.

``read`` / ``write``: takes NAME as a reader or the writer (ttl 1.5 s, retry delay 0.2 s, through the
grant queue, the default), prints {"waiting": true} before it asks, {"held": true, "start": ...} once it
holds, keeps it SECONDS, then prints {"released": true, "end": ...} and exits.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from redlock_async import Lock, Redlock


async def hold(name: str, ttl: float, urls: list[str]) -> int:
    async with Redlock(urls, retry_delay=0.05) as redlock:
        reader = redlock.rw_lock(name, ttl=ttl).read()
        async with reader:
            print(json.dumps({"held": True, "validity": reader.validity}), flush=True)
            await asyncio.sleep(3600)
    return 0


async def mix(name: str, seconds: float, urls: list[str]) -> int:
    stop = time.monotonic() + seconds
    async with Redlock(urls, retry_delay=0.02) as redlock:

        async def section(client: str, lock: Lock, shared: bool) -> None:
            async with lock:
                start = time.monotonic()
                await asyncio.sleep(random.uniform(0.002, 0.02))
                end = time.monotonic()
                row = {"client": client, "token": lock.token, "fencing": lock.fencing_token, "shared": shared}
                print(json.dumps({**row, "start": start, "end": end}), flush=True)

        async def reader(i: int) -> None:
            while time.monotonic() < stop:
                await section(f"reader-{i}", redlock.rw_lock(name, ttl=2.0, fencing=True).read(), True)

        async def writer() -> None:
            while time.monotonic() < stop:
                await section("writer", redlock.rw_lock(name, ttl=2.0, fencing=True).write(), False)
                await asyncio.sleep(random.uniform(0.01, 0.04))

        await asyncio.gather(*(reader(i) for i in range(4)), writer())
    return 0


async def take(kind: str, name: str, seconds: float, urls: list[str]) -> int:
    async with Redlock(urls, retry_delay=0.2) as redlock:
        rw = redlock.rw_lock(name, ttl=1.5, acquire_timeout=30.0)
        lock = rw.read() if kind == "read" else rw.write()
        print(json.dumps({"waiting": True}), flush=True)
        async with lock:
            print(json.dumps({"held": True, "start": time.monotonic()}), flush=True)
            await asyncio.sleep(seconds)
            end = time.monotonic()
        print(json.dumps({"released": True, "end": end}), flush=True)
    return 0


if __name__ == "__main__":
    command, name, number, *urls = sys.argv[1:]
    if command in ("read", "write"):
        sys.exit(asyncio.run(take(command, name, float(number), urls)))
    run = hold if command == "hold" else mix
    sys.exit(asyncio.run(run(name, float(number), urls)))
