"""A lock holder in a process of its own, for tests that stop it with SIGSTOP (tests/test_client_pause.py).

usage: python tests/_paused_client.py RESOURCE TTL URL [URL ...]

Acquires RESOURCE (fencing on) inside ``async with``, prints one JSON line
``{"event": "entered", ...}`` and waits in its critical section. What ends the
section is printed as a second JSON line holding the recorded section:

* ``lost``: ``async with`` raised LockLost (exit status 0), what should happen;
* ``carried-on``: the body ran to its end believing it held the lock (exit 1);
* ``error``: anything else (exit 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from typing import Any

from redlock_async import LockLost, Redlock
from redlock_async.testing import History

BODY = 30.0
"""Seconds the critical section would last if nothing ended it: far longer than any test waits."""


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def main(resource: str, ttl: float, urls: list[str]) -> int:
    history = History()
    async with Redlock(urls, fencing=True, retry_delay=0.05) as redlock:
        lock = redlock.lock(resource, ttl=ttl, acquire_timeout=10.0)
        try:
            async with lock:
                with history.section("paused", lock):
                    say(event="entered", validity=lock.validity, now=time.monotonic())
                    await asyncio.sleep(BODY)
        except LockLost as exc:
            say(event="lost", section=dataclasses.asdict(history.sections[0]), message=str(exc))
            return 0
        except Exception as exc:
            say(event="error", message=f"{type(exc).__name__}: {exc}")
            return 2
    say(event="carried-on", section=dataclasses.asdict(history.sections[0]))
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3:])))
