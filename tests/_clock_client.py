"""A client in a process of its own, for tests/test_clock_guard.py: holds a lock, or contends for it.

``python tests/_clock_client.py ROLE NAME TTL SECONDS GUARD URL...``

* ``hold``: takes the lock in ``async with`` and keeps it (the watchdog extends it) until the parent
  writes a line to its stdin (the faults are in), then *SECONDS* more, or until it is lost.
* ``contend``: first takes and releases another lock (so it has talked to every node: its clock guard
  has a reading of each), then tries the lock again and again for *SECONDS*, holding it 50 ms each time.

Both print ``{"event": "ready"}`` once set, then JSON lines: each critical section (``section``: for
``History``), each clock event of the guard and each lost lock (``clock``, ``lost``, with the
monotonic time at which the library told it), and the nodes' smoothed round trips (``rtt``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from redlock_async import LockLost, Redlock
from redlock_async.events import EventKind, LockEvent
from redlock_async.testing import History


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def answered(redlock: Redlock) -> None:
    """Until every node has answered all we sent (an early quorum leaves the slowest pending): the guard
    has a reading of every node's clock from before the test changes any."""
    while any(node.unanswered for node in redlock.statistics().nodes):
        await asyncio.sleep(0.005)


def told(event: LockEvent) -> None:
    if event.kind is EventKind.CLOCK:
        say(event="clock", at=time.monotonic(), node=event.nodes[0], fault=event.clock_fault, jump=event.clock_jump)
    elif event.kind is EventKind.LOST:
        say(event="lost", at=time.monotonic(), reason=event.reason)


async def main(role: str, name: str, ttl: float, seconds: float, guard: bool, urls: list[str]) -> None:
    history = History()
    async with Redlock(urls, ttl=ttl, retry_delay=0.02, clock_guard=guard, on_event=told) as redlock:
        lock = redlock.lock(name)
        if role == "hold":
            try:
                async with lock:
                    with history.section("holder", lock):
                        await answered(redlock)
                        say(event="ready")
                        await asyncio.to_thread(sys.stdin.readline)  # the parent's faults are in
                        await asyncio.sleep(seconds)
            except LockLost:
                pass
        else:
            warm = redlock.lock(name + ":warm")
            await warm.acquire()
            await warm.release()
            await answered(redlock)
            say(event="ready")
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                if await lock.acquire(timeout=0.2):
                    with history.section("contender", lock):
                        await asyncio.sleep(0.05)
                    await lock.release()
        stats = redlock.statistics()
        say(event="rtt", round_trip=max(node.round_trip or 0.0 for node in stats.nodes))
    for s in history.sections:
        say(event="section", client=s.client, token=s.token, fencing_token=s.fencing_token, start=s.start, end=s.end)


if __name__ == "__main__":
    role, name, ttl, seconds, guard, *urls = sys.argv[1:]
    run = main(role, name, float(ttl), float(seconds), guard == "1", urls)
    if os.environ.get("REDLOCK_TEST_LOOP") == "uvloop":  # the loop the tests run on (the parent's setting)
        import uvloop

        uvloop.run(run)
    else:
        asyncio.run(run)
