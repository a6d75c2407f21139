"""One OS process contending for a lock while its voters fail over (tests/test_failover_history.py).

usage: python tests/_failover_contender.py DIR QUARANTINE URL [URL ...]

A few tasks take the fenced lock ``failover`` (ttl :data:`TTL`) inside ``async with`` in a loop, each
section a few milliseconds, until the file DIR/stop appears (or :data:`LONGEST` s passed); none while
DIR/quiet exists (the lock goes free: no key left on any node once the attempts under way ended). A section
that begins after the time written in DIR/hold (monotonic seconds, system-wide on Linux) lasts as long
as that file exists: its holder sits in it through the failovers the test makes meanwhile. QUARANTINE
is the ``restart_quarantine`` setting ("none" for the default). DIR/ready.PID says the process is
connected and contending. Each section is printed at the end as
a JSON line (client, token, fencing token, start, end), for one :class:`History` of every process.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

from redlock_async import LockLost, LockNotAcquired, Redlock
from redlock_async.testing import History

TASKS = 2
TTL = 10.0
LONGEST = 120.0


def _hold_from(folder: Path) -> float:
    """The monotonic time after which sections last while DIR/hold exists (infinity without the file)."""
    try:
        return float((folder / "hold").read_text())
    except (OSError, ValueError):
        return float("inf")


async def contend(folder: Path, quarantine: float | None, urls: list[str]) -> History:
    history = History()
    end = time.monotonic() + LONGEST
    stop = folder / "stop"

    def running() -> bool:
        return not stop.exists() and time.monotonic() < end

    async with Redlock(urls, fencing=True, retry_delay=0.05, restart_quarantine=quarantine) as redlock:
        await redlock.connect()
        (folder / f"ready.{os.getpid()}").touch()

        async def task(n: int) -> None:
            lock = redlock.lock("failover", ttl=TTL, acquire_timeout=1.0)
            while running():
                if (folder / "quiet").exists():  # the test lets the lock go free for a moment
                    await asyncio.sleep(0.01)
                    continue
                try:
                    async with lock:
                        with history.section(f"pid{os.getpid()}.{n}", lock):
                            began = time.monotonic()
                            if began > _hold_from(folder):
                                while (folder / "hold").exists() and running():
                                    await asyncio.sleep(0.02)
                            else:
                                await asyncio.sleep(random.uniform(0.0, 0.005))
                except (LockNotAcquired, LockLost):
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(task(n) for n in range(TASKS)))
    return history


def main() -> int:
    folder, quarantine, urls = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    history = asyncio.run(contend(folder, None if quarantine == "none" else float(quarantine), urls))
    for s in history.sections:
        print(json.dumps([s.client, s.token, s.fencing_token, s.start, s.end]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
