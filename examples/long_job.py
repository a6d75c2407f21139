"""A long job that extends its lock itself, between chunks of work.

With ``auto_extend=False`` no watchdog keeps the lease: the job calls
``await lock.extend()`` after each chunk, which resets the lease to a full
ttl. Each chunk must therefore take well under the ttl. The extend also
checks that the lock is still ours before the chunk's result is committed:
when a chunk overran the lease (a stall, a slow dependency), ``extend()``
raises ``LockLost`` and someone else may hold the lock by now, so the job
stops without committing anything more.

Runs against the nodes in $REDLOCK_NODES (comma-separated URLs), or against
5 embedded valkey-server nodes when it is unset:

    python examples/long_job.py
"""

from __future__ import annotations

import asyncio
import time

from redlock_async import LockLost, Redlock
from redlock_async.testing import nodes_from_env

TTL = 0.5  # seconds; short to keep the demo quick (a real job: its longest chunk, several times over)
CHUNKS = 5


async def run_job(redlock: Redlock, job: str, log: list[str], *, stall_at: int | None = None) -> bool:
    """Run *job* chunk by chunk under its lock; False when the lock was lost on the way."""
    async with redlock.lock(job, ttl=TTL, auto_extend=False) as lock:
        started = time.monotonic()
        for chunk in range(1, CHUNKS + 1):
            await asyncio.sleep(1.5 if chunk == stall_at else 0.15)  # compute the chunk
            try:
                await lock.extend()  # still ours, for another TTL from now?
            except LockLost:
                # Do not commit this chunk, nor start another: the lock may be someone else's now.
                log.append(
                    f"{job}: lock lost after chunk {chunk}: stopped, chunks {chunk}-{CHUNKS} left to the new holder"
                )
                return False
            log.append(f"{job}: chunk {chunk}/{CHUNKS} committed, {lock.validity:.2f} s of lease left")
        log.append(f"{job}: all {CHUNKS} chunks done in {time.monotonic() - started:.2f} s, past its {TTL} s ttl")
        return True


async def rival_tries(redlock: Redlock, job: str, log: list[str]) -> None:
    """Another machine wants the job once its first lease would have run out."""
    await asyncio.sleep(TTL + 0.1)
    lock = redlock.lock(job, ttl=TTL)
    if await lock.acquire(blocking=False):
        log.append(f"rival: took {job}")
        await lock.release()
    else:
        log.append(f"rival: {job} is held, not taken")


async def rival_takes_over(redlock: Redlock, job: str, log: list[str]) -> None:
    """Another machine waits for the job, and gets it when its holder stalls past the lease."""
    await asyncio.sleep(0.1)
    async with redlock.lock(job, ttl=TTL, acquire_timeout=5.0):
        log.append(f"rival: took {job} over")
        await asyncio.sleep(0.2)


async def main(urls: list[str]) -> list[str]:
    log: list[str] = []
    async with Redlock(urls) as worker, Redlock(urls) as rival:  # two machines
        await asyncio.gather(run_job(worker, "export", log), rival_tries(rival, "export", log))
        await asyncio.gather(run_job(worker, "import", log, stall_at=2), rival_takes_over(rival, "import", log))
    return log


if __name__ == "__main__":
    with nodes_from_env() as urls:
        for line in asyncio.run(main(urls)):
            print(line)
