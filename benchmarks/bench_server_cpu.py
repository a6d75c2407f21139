"""Where a concurrent run's CPU goes: the client's and the nodes' (valkey-server processes), per pair.

Usage::

    python benchmarks/bench_server_cpu.py [--rounds 10] [--loop asyncio|uvloop] [SETTINGS ...]
    python benchmarks/bench_server_cpu.py --scripts

Each SETTINGS is a ``Redlock`` keyword list as Python would write it (``""`` for the defaults,
``"queue=False"``, ``"clock_guard=False, queue=False"``): one Redlock each, on the same 5 local
nodes, taking turns each round (64 tasks, each on a lock of its own, acquire+release). Printed per
setting, medians of the rounds: pairs per second, client CPU per pair, and the CPU all 5 servers
used per pair (read from ``/proc``: Linux only). On a machine shared with other work the client's
and the servers' CPU per pair move far less than the throughput does.

``--scripts``: the CPU one node spends on a SET NX PX and its release, pipelined from redis-py,
for RELEASE (one key; twice, A/A, for the noise), RELEASE given QUEUE_LEAVE's four keys, QUEUE_LEAVE
(the default's release, with nobody in line), HANDED_RELEASE, and, where the server has it (Valkey 9),
the native DELIFEQ alone and followed by the release word's PUBLISH: what a release costs the node.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from redlock_async import Redlock
from redlock_async._scripts import HANDED_RELEASE, QUEUE_LEAVE, RELEASE
from redlock_async.testing import LocalNodes

TASKS = 64
PER_TASK = 20


def children_cpu() -> float:
    """CPU seconds used so far by this process's children (the servers LocalNodes started)."""
    me, ticks = os.getpid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def concurrent(urls: list[str], settings: list[str], rounds: int) -> None:
    options: list[dict[str, Any]] = [eval(f"dict({text})") for text in settings]
    redlocks = [Redlock(urls, **option) for option in options]
    for redlock in redlocks:
        await redlock.connect()
    found: dict[int, list[tuple[float, float, float]]] = {k: [] for k in range(len(settings))}
    try:
        for _ in range(rounds + 1):  # the first round warms up
            for k, redlock in enumerate(redlocks):

                async def worker(i: int, redlock: Redlock = redlock) -> None:
                    lock = redlock.lock(f"servercpu:{i}", ttl=10.0)
                    for _ in range(PER_TASK):
                        await lock.acquire()
                        await lock.release()

                servers, client, began = children_cpu(), time.process_time(), time.perf_counter()
                await asyncio.gather(*(worker(i) for i in range(TASKS)))
                pairs = TASKS * PER_TASK
                found[k].append(
                    (
                        pairs / (time.perf_counter() - began),
                        (time.process_time() - client) / pairs,
                        (children_cpu() - servers) / pairs,
                    )
                )
    finally:
        for redlock in redlocks:
            await redlock.aclose()
    for k, text in enumerate(settings):
        rows = found[k][1:]
        rate, client, servers = (statistics.median(row[j] for row in rows) for j in range(3))
        print(
            f"{text or 'defaults':32s} {rate:8.0f} pairs/s  client {client * 1e6:5.1f} us/pair  "
            f"5 servers {servers * 1e6:5.1f} us/pair"
        )


def scripts(pairs: int = 40_000, rounds: int = 5) -> None:
    import redis

    variants = {
        "RELEASE, 1 key": (RELEASE.source, 1),
        "RELEASE, 1 key (A/A)": (RELEASE.source, 1),
        "RELEASE, 4 keys": (RELEASE.source, 4),
        "QUEUE_LEAVE, 4 keys": (QUEUE_LEAVE.source, 4),
        "HANDED_RELEASE": (HANDED_RELEASE.source, 1),
    }
    # Native compare-and-delete where the server has it (Valkey 9: DELIFEQ), with the release word as a
    # second command (RELEASE publishes it only when it deleted): against the scripts in the same run.
    natives = {"DELIFEQ": False, "DELIFEQ + PUBLISH": True}
    with LocalNodes(1) as nodes:
        client = redis.Redis.from_url(nodes.urls[0])
        shas = {name: client.script_load(source) for name, (source, _) in variants.items()}
        try:
            client.execute_command("DELIFEQ", "servercpu:probe", "x")  # type: ignore[no-untyped-call]
        except redis.ResponseError:
            natives = {}  # not this server
        used: dict[str, list[float]] = {name: [] for name in [*variants, *natives]}
        token = b"t" * 24
        for _ in range(rounds):
            for name in used:
                nkeys = variants[name][1] if name in variants else 1
                pipe = client.pipeline(transaction=False)
                began = children_cpu()
                for i in range(pairs):
                    key = f"servercpu:{i % 64}"
                    pipe.set(key, token, px=10_000, nx=True)
                    if name in natives:
                        pipe.execute_command("DELIFEQ", key, token)  # type: ignore[no-untyped-call]
                        if natives[name]:
                            pipe.publish(key, b"0" * 40)
                    else:
                        pipe.evalsha(shas[name], nkeys, *[key, key + ":q", key + ":w", key + ":f"][:nkeys], token)
                    if i % 1000 == 999:
                        pipe.execute()
                        pipe = client.pipeline(transaction=False)
                pipe.execute()
                used[name].append((children_cpu() - began) / pairs)
        client.close()
    for name, values in used.items():
        print(f"{name:22s} {statistics.median(values) * 1e6:5.2f} us of node CPU per SET NX PX + release")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("settings", nargs="*", default=["", "queue=False"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--scripts", action="store_true", help="the node CPU of one release script, per kind")
    args = parser.parse_args()
    if args.scripts:
        scripts()
        return 0
    with LocalNodes(5) as nodes:
        work = concurrent(nodes.urls, args.settings, args.rounds)
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(work)
        else:
            asyncio.run(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
