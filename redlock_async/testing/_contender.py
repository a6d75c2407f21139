"""One OS process contending for a lock.

``python -m redlock_async.testing._contender URLS SECONDS NAME QUARANTINE [LIMIT]``

Runs a few tasks that take the fenced lock *NAME* (with *LIMIT*: a permit of the semaphore *NAME*)
in a loop for *SECONDS*, and prints each critical
section as a JSON line (client, token, fencing token, start, end): monotonic times are system-wide on
Linux, so the sections of several processes merge into one :class:`History` for the checker.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from redlock_async import Redlock
from redlock_async.testing._history import History

TASKS = 3
TTL = 1.0


async def contend(urls: list[str], seconds: float, name: str, quarantine: float, limit: int = 0) -> History:
    history = History()
    stop = time.monotonic() + seconds
    async with Redlock(urls, fencing=True, retry_delay=0.02, acquire_timeout=0.5, restart_quarantine=quarantine) as r:

        async def task(n: int) -> None:
            lock = r.semaphore(name, limit=limit, ttl=TTL) if limit else r.lock(name, ttl=TTL)
            while time.monotonic() < stop:
                if not await lock.acquire():
                    continue
                try:
                    with history.section(f"pid{os.getpid()}.{n}", lock):
                        await asyncio.sleep(random.uniform(0.0, 0.002))
                finally:
                    await lock.release()

        await asyncio.gather(*(task(n) for n in range(TASKS)))
    return history


def main() -> int:
    urls, seconds, name, quarantine = sys.argv[1].split(","), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    limit = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    history = asyncio.run(contend(urls, seconds, name, quarantine, limit))
    for s in history.sections:
        print(json.dumps([s.client, s.token, s.fencing_token, s.start, s.end]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
