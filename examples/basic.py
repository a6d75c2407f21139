"""The basics: a lock per order, taken by several concurrent workers.

Runs against the nodes in $REDLOCK_NODES (comma-separated URLs), or against
5 embedded valkey-server nodes when it is unset:

    python examples/basic.py
"""

from __future__ import annotations

import asyncio

from redlock_async import LockNotAcquired, Redlock
from redlock_async.testing import nodes_from_env


async def process(redlock: Redlock, order: int, worker: str, log: list[str]) -> None:
    try:
        async with redlock.lock(f"orders:{order}", ttl=5.0, acquire_timeout=0.05):
            log.append(f"{worker} processes order {order}")
            await asyncio.sleep(0.1)
    except LockNotAcquired:
        log.append(f"{worker} skips order {order}: someone else has it")


async def main(urls: list[str]) -> list[str]:
    log: list[str] = []
    async with Redlock(urls) as a, Redlock(urls) as b:  # two "machines"
        await asyncio.gather(
            process(a, 1, "a", log),
            process(b, 1, "b", log),  # the same order: one of them skips
            process(b, 2, "b", log),  # another order: runs in parallel
        )
    return log


if __name__ == "__main__":
    with nodes_from_env() as urls:
        for line in asyncio.run(main(urls)):
            print(line)
