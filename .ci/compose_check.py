"""Checks the five nodes of examples/compose as a user would meet them (run by .ci/docker-tests).

Each node is a master with no replicas, keeps an append-only file and never evicts; a lock is
taken and given back on them, and `redlock status` reads them. Exits non-zero on any miss.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import redis

from redlock_async import Redlock


def wait_for(urls: list[str]) -> list[redis.Redis]:
    clients = [redis.Redis.from_url(url, socket_timeout=2) for url in urls]
    deadline = time.monotonic() + 30
    for client in clients:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return clients


async def lock_once(urls: list[str]) -> None:
    async with Redlock(urls, fencing=True) as redlock, redlock.lock("compose-check") as lock:
        assert lock.held
        assert lock.fencing_token is not None


def main() -> int:
    urls = os.environ["REDLOCK_NODES"].split(",")
    clients = wait_for(urls)
    for url, client in zip(urls, clients, strict=True):
        config = {**client.config_get("appendonly"), **client.config_get("maxmemory-policy")}
        replication = client.info("replication")
        assert config == {"appendonly": "yes", "maxmemory-policy": "noeviction"}, (url, config)
        assert replication["role"] == "master", (url, replication)
        assert replication["connected_slaves"] == 0, (url, replication)
    asyncio.run(lock_once(urls))
    status = subprocess.run([sys.executable, "-m", "redlock_async", "status", "compose-check"], check=False)
    assert status.returncode == 0, f"redlock status: exit {status.returncode}, 0 (free) expected"
    print(f"   compose: {len(urls)} masters, appendonly, noeviction; a fenced lock taken and given back; status free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
