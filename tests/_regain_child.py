"""A holder process for tests/test_regain.py: takes one contended lock again and again.

usage: python -m tests._regain_child RESOURCE SECTIONS URL [URL ...]

Each section (``async with`` a lock of ttl ``TTL``) prints one JSON line: the nodes holding the
section's token right after the grant (``granted``) and right after each extension (``extended``,
two at least, then until every node holds it or ``MOST`` were made), read with a plain client of its
own on each node, and each extension's votes (``votes``).
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis

from redlock_async import Redlock

TTL = 2.0
THRESHOLD = 0.75
"""The watchdog extends about every 0.5 s with 1.5 s of margin: a 1 s lease extended with half of it
left was lost on a loaded CI box (three of these processes, five servers and the suite on 2 cores)."""
MOST = 6
"""Extensions a section waits for at most. The first takes the nodes that answered the grant without
a yes; a node whose no comes late (pending at a round's decision) is taken by the round after its
reply, which on a loaded box may be the third or fourth (CI saw a node missing after two). Before the
regain, no extension took a free node: a section granted on 3 or 4 stayed there through all of them."""


def on(clients: list[redis.Redis], key: str, token: bytes) -> list[int]:
    return [i for i, client in enumerate(clients) if client.get(key) == token]


async def main(resource: str, sections: int, urls: list[str]) -> int:
    clients = [redis.Redis.from_url(url) for url in urls]
    key = f"redlock:{resource}"
    async with Redlock(urls, retry_delay=0.05, extend_threshold=THRESHOLD) as redlock:
        for _ in range(sections):
            lock = redlock.lock(resource, ttl=TTL, acquire_timeout=30.0)
            async with lock:
                assert lock.token is not None
                token = lock.token.encode()
                granted = await asyncio.to_thread(on, clients, key, token)  # (not blocking the loop)
                extended: list[list[int]] = []
                votes: list[list[str]] = []
                while len(extended) < 2 or (len(extended[-1]) < len(urls) and len(extended) < MOST):
                    while lock.statistics().extensions <= len(extended):
                        await asyncio.sleep(0.01)
                    votes.append([outcome.vote.value for outcome in lock.outcomes])
                    extended.append(await asyncio.to_thread(on, clients, key, token))
            print(json.dumps({"granted": granted, "extended": extended, "votes": votes}), flush=True)
    for client in clients:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
