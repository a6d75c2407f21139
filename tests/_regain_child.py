"""A holder process for tests/test_regain.py: takes one contended lock again and again.

usage: python -m tests._regain_child RESOURCE SECTIONS URL [URL ...]

Each section (``async with`` a lock of ttl ``TTL``) prints one JSON line: the nodes holding the
section's token right after the grant (``granted``) and right after its first and second
extensions (``extended``), read with a plain client of its own on each node.
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis

from redlock_async import Redlock

TTL = 1.0
"""Seconds: the watchdog extends about every 0.5 s (extend_threshold 0.5: half a lease of margin on a
busy machine)."""


def on(clients: list[redis.Redis], key: str, token: bytes) -> list[int]:
    return [i for i, client in enumerate(clients) if client.get(key) == token]


async def main(resource: str, sections: int, urls: list[str]) -> int:
    clients = [redis.Redis.from_url(url) for url in urls]
    key = f"redlock:{resource}"
    async with Redlock(urls, retry_delay=0.05, extend_threshold=0.5) as redlock:
        for _ in range(sections):
            lock = redlock.lock(resource, ttl=TTL, acquire_timeout=30.0)
            async with lock:
                assert lock.token is not None
                token = lock.token.encode()
                granted = await asyncio.to_thread(on, clients, key, token)  # (not blocking the loop)
                extended = []
                for extensions in (1, 2):
                    while lock.statistics().extensions < extensions:
                        await asyncio.sleep(0.01)
                    extended.append(await asyncio.to_thread(on, clients, key, token))
            print(json.dumps({"granted": granted, "extended": extended}), flush=True)
    for client in clients:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
