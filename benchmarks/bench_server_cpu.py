"""Where a concurrent run's CPU goes: the client's and the nodes' (valkey-server processes), per pair.

Usage::

    python benchmarks/bench_server_cpu.py [--rounds 10] [--loop asyncio|uvloop] [SETTINGS ...]
    python benchmarks/bench_server_cpu.py --scripts
    python benchmarks/bench_server_cpu.py --cluster-shards 1,2,3 [--seconds 2] [--rounds 3] [--json PATH]
    python benchmarks/bench_server_cpu.py --cluster-shards 1,2,3 --tasks-per-shard --instructions [--json PATH]

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

``--cluster-shards``: a Cluster voter's capacity as its shards grow (issue 39). For each S, one
``redis+cluster://`` voter of S shards (no replicas) beside 2 standalone voters, all marked in service
first; 64 tasks doing ``async with redlock.lock(name)`` on fresh names for ``--seconds``: pairs/s, each
shard primary's and each standalone voter's CPU per pair (``INFO cpu`` deltas less an idle window's),
commands per pair and per event-loop cycle (``INFO stats``); then the uncontended p50 of the cluster
voter with the 2 standalone ones against 3 standalone voters, and of the cluster voter alone against one
standalone voter. Every size runs in each round (the order rotating); medians over ``--rounds``. One
client process drives it all: on a small machine the client is the limit, and as S grows each primary gets
fewer commands per wake-up, so the timed CPU per pair carries each wake-up's fixed cost (system calls).

``--instructions [PAIRS]`` (with ``--cluster-shards``; valgrind must be installed): then the same split in
a count no load moves. One voter at a time, every server of it under ``valgrind --tool=callgrind`` (so the
client keeps each one busy: full batches), alone in a ``Redlock``: a standalone voter, each Cluster voter of
S shards with 64 tasks per primary, and the largest S again with 64 tasks in all. Each primary's counters
are zeroed (``callgrind_control -z``) after a warm-up and dumped (``-d``) after PAIRS (12) pairs per task;
the instructions in its cron, its cluster bus and the client's ``INFO`` and ``CLUSTER SHARDS``/``SLOTS``
(work by the clock, ~50 times heavier per pair under callgrind than live) are left out. Printed per voter:
instructions per pair summed over its primaries, each primary's share, commands per pair and per read
(``readQueryFromClient`` calls: a wake-up's batch) per primary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from _common import library_commit

import redlock_async.testing._server_process as server_process
from redlock_async import Redlock
from redlock_async._health._markers import marker_value
from redlock_async._nodes import tag_for
from redlock_async._scripts import HANDED_RELEASE, QUEUE_LEAVE, RELEASE
from redlock_async.testing import LocalCluster, LocalNodes, server_binary

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


# -- --cluster-shards: a Cluster voter's capacity as its shards grow (issue 39, item 5) ----------------

CLUSTER_TASKS = 64  # concurrent tasks of the throughput phase, each on names of its own
LATENCY_OPS = 300  # sequential uncontended pairs per p50 (after LATENCY_WARMUP untimed ones)
LATENCY_WARMUP = 50
IN_SERVICE = 3600.0  # the period the voters are marked in service under (longer than the run)


def _cpu(node: Any, fields: tuple[str, ...] = ("used_cpu_sys", "used_cpu_user")) -> float:
    """used_cpu_sys + used_cpu_user of one server (INFO cpu), seconds."""
    info: Any = node.command("INFO", "cpu")
    return sum(float(info[field]) for field in fields)


def _commands(node: Any) -> tuple[int, int]:
    """total_commands_processed and eventloop_cycles (its wake-ups) of one server (INFO stats)."""
    info: Any = node.command("INFO", "stats")
    return int(info["total_commands_processed"]), int(info.get("eventloop_cycles", 0))


def _identity(node: Any) -> tuple[bytes, bytes]:
    server: Any = node.command("INFO", "server")
    replication: Any = node.command("INFO", "replication")
    return str(server["run_id"]).encode(), str(replication["master_replid"]).encode()


def mark_voters(cluster: LocalCluster, plain: LocalNodes) -> None:
    """Leave the markers a client leaves on voters it judged in service, so that no voter (nor shard) of a
    fresh cluster sits out the new-cluster quarantine first (the idea of tests' mark_in_service/mark_shards)."""
    for node in plain.nodes:
        node.command("SET", "redlock:", marker_value(_identity(node)[0], IN_SERVICE))
    mark_shards(cluster)


def mark_shards(cluster: LocalCluster) -> None:
    """The in-service marker on each shard's primary (in the slot a client looks for it)."""
    for shard in range(len(cluster.shards)):
        master = cluster.master_of(shard)
        run_id, replid = _identity(master)
        lowest = cluster.slot_ranges(shard)[0]
        master.command("SET", b"redlock:" + tag_for(lowest), marker_value(run_id + b"." + replid, IN_SERVICE))


async def _throughput(redlock: Redlock, seconds: float, tag: str, tasks: int = CLUSTER_TASKS) -> int:
    """Pairs done by *tasks* tasks in *seconds*, each pair on a name never used before."""
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> int:
        n = 0
        while time.perf_counter() < stop and n < 1_000_000:
            async with redlock.lock(f"scale:{tag}:{i}:{n}"):
                pass
            n += 1
        return n

    async with asyncio.timeout(seconds + 30):
        return sum(await asyncio.gather(*(worker(i) for i in range(tasks))))


async def _p50s(redlocks: list[Redlock], tag: str) -> list[tuple[float, float]]:
    """Median µs of one task's uncontended acquire+release (async with), each on a fresh name, and the
    client's CPU µs per such pair (this process's, the event loop's idle included), for each of *redlocks*,
    taking turns pair by pair (a change in the machine's load meets them all alike)."""
    took: list[list[float]] = [[] for _ in redlocks]
    cpu = [0.0 for _ in redlocks]
    async with asyncio.timeout(120):
        for n in range(LATENCY_WARMUP + LATENCY_OPS):
            for k, redlock in enumerate(redlocks):
                began, used = time.perf_counter_ns(), time.process_time()
                async with redlock.lock(f"scale:{tag}:{k}:p50:{n}"):
                    pass
                took[k].append((time.perf_counter_ns() - began) / 1e3)
                cpu[k] += (time.process_time() - used) if n >= LATENCY_WARMUP else 0.0
    return [(statistics.median(t[LATENCY_WARMUP:]), c / LATENCY_OPS * 1e6) for t, c in zip(took, cpu, strict=True)]


async def _one_size(cluster: LocalCluster, plain: LocalNodes, seconds: float, per_shard: bool) -> dict[str, Any]:
    masters = [cluster.master_of(i) for i in range(len(cluster.shards))]
    mixed = [cluster.url, *plain.urls[:2]]
    found: dict[str, Any] = {}
    servers = [*masters, *plain.nodes[:2]]
    async with Redlock(mixed) as redlock:
        await _throughput(redlock, min(0.5, seconds), "warm")
        # An idle window as long as the timed one, the client connected: what the servers spend with no
        # pairs (cron, the cluster bus, the client's health checks), subtracted from the timed window.
        idle_from = [_cpu(node) for node in servers]
        began = time.perf_counter()
        await asyncio.sleep(min(1.0, seconds))
        idle = [(_cpu(node) - c) / (time.perf_counter() - began) for node, c in zip(servers, idle_from, strict=True)]
        before, commands = [_cpu(node) for node in servers], [_commands(node) for node in servers]
        user = [_cpu(node, ("used_cpu_user",)) for node in servers]
        began = time.perf_counter()
        pairs = await _throughput(redlock, seconds, "run", CLUSTER_TASKS * (len(masters) if per_shard else 1))
        elapsed = time.perf_counter() - began
        used = [_cpu(node) - c - rate * elapsed for node, c, rate in zip(servers, before, idle, strict=True)]
        sent = [
            tuple(b - a for a, b in zip(c, _commands(node), strict=True))
            for node, c in zip(servers, commands, strict=True)
        ]
        user = [_cpu(node, ("used_cpu_user",)) - c for node, c in zip(servers, user, strict=True)]
        found |= {
            "pairs": pairs,
            "pairs_per_s": pairs / elapsed,
            "idle_ms_per_s": [rate * 1e3 for rate in idle],
            "us_per_pair": [u / pairs * 1e6 for u in used],  # net of idle: the shard primaries, then the 2 standalone
            "commands_per_pair": [c / pairs for c, _ in sent],
            "commands_per_cycle": [c / cycles if cycles else 0.0 for c, cycles in sent],
            "user_us_per_pair": [u / pairs * 1e6 for u in user],  # gross: idle not subtracted
        }
        async with (
            Redlock(plain.urls) as standalone,
            Redlock([cluster.url]) as cluster_alone,
            Redlock(plain.urls[:1]) as standalone_alone,
        ):
            p50s = await _p50s([redlock, standalone, cluster_alone, standalone_alone], "p50")
    names = ("mixed", "standalone", "cluster_alone", "standalone_alone")
    found |= {f"p50_us_{name}": p50 for name, (p50, _) in zip(names, p50s, strict=True)}
    found |= {f"client_cpu_us_{name}": cpu for name, (_, cpu) in zip(names, p50s, strict=True)}
    return found


def _median_row(found: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (element by element for the per-server lists)."""
    row: dict[str, Any] = {}
    for key, first in found[0].items():
        if isinstance(first, list):
            row[key] = [statistics.median(f[key][i] for f in found) for i in range(len(first))]
        else:
            row[key] = statistics.median(f[key] for f in found)
    return row


def cluster_shards(
    sizes: list[int],
    seconds: float,
    loop: str,
    rounds: int,
    json_path: Path | None = None,
    per_shard: bool = False,
    instruction_pairs: int = 0,
) -> None:
    """For each S in *sizes*: one Cluster voter of S shards (no replicas) beside 2 standalone voters.

    Every cluster runs from the start; each round measures every size, the order rotating from round to
    round (drift in the box's load spreads over the sizes), and the table shows medians over the rounds.
    """
    found: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
    both: list[list[tuple[float, float]]] = []  # per round: (p50, client CPU) of the cluster voters, of standalone
    load_before = list(os.getloadavg())
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(LocalNodes(3))
        clusters = {size: stack.enter_context(LocalCluster(size, 0)) for size in sizes}
        for cluster in clusters.values():
            mark_voters(cluster, plain)

        async def every_round() -> None:
            for r in range(rounds):
                for size in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
                    found[size].append(await _one_size(clusters[size], plain, seconds, per_shard))
                # Every cluster of the run as a voter (1, 2 and 3 shards) against as many standalone voters
                async with (
                    Redlock([cluster.url for cluster in clusters.values()]) as of_clusters,
                    Redlock(plain.urls[: len(clusters)]) as of_standalone,
                ):
                    both.append(await _p50s([of_clusters, of_standalone], "voters"))

        uvloop_run(every_round()) if loop == "uvloop" else asyncio.run(every_round())
    rows = {size: _median_row(found[size]) for size in sizes}
    heading = (
        f"1 Cluster voter (S shards, no replicas) + 2 standalone voters, "
        f"{CLUSTER_TASKS} tasks{' per shard' if per_shard else ''}, each pair on "
        f"a fresh name, {seconds:g} s timed per size and round, medians of {rounds} rounds, --loop {loop}"
    )
    table = cluster_table(rows)
    print(f"\n{heading}\n\n{table}\n")
    print(
        "CPU: INFO cpu (used_cpu_sys + used_cpu_user) deltas over the timed window, less each server's idle "
        "rate (measured just before, the client connected) times the window; / pairs."
    )
    voters: dict[str, Any] = {
        "sizes": sizes,
        "p50_us_clusters": statistics.median(b[0][0] for b in both),
        "p50_us_standalone": statistics.median(b[1][0] for b in both),
        "client_cpu_us_clusters": statistics.median(b[0][1] for b in both),
        "client_cpu_us_standalone": statistics.median(b[1][1] for b in both),
        "rounds": both,
    }
    print(
        f"p50 of {len(sizes)} Cluster voters ({', '.join(map(str, sizes))} shards) {voters['p50_us_clusters']:.0f} µs, "
        f"of {len(sizes)} standalone voters {voters['p50_us_standalone']:.0f} µs: "
        f"{voters['p50_us_clusters'] / voters['p50_us_standalone']:.2f}x (medians of {rounds} rounds; the two "
        f"take turns pair by pair); the client's CPU per such pair {voters['client_cpu_us_clusters']:.0f} µs and "
        f"{voters['client_cpu_us_standalone']:.0f} µs"
    )
    counted: dict[str, Any] = {}
    if instruction_pairs:
        counted = {"heading": grind_heading(instruction_pairs), "rows": grind(sizes, instruction_pairs)}
        counted["table"] = grind_table(counted["rows"])
        print(f"\n{counted['heading']}\n\n{counted['table']}\n")
    if json_path is not None:
        command = "python benchmarks/bench_server_cpu.py " + " ".join(sys.argv[1:])
        data = {
            "command": command.replace(f" --json {json_path}", ""),
            "commit": library_commit(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu_count": os.cpu_count(),
            "load_average": {"before": load_before, "after": list(os.getloadavg())},
            "heading": heading,
            "table": table,
            "rows": {str(size): row for size, row in rows.items()},
            "rounds": {str(size): found[size] for size in sizes},
            "cluster_voters_p50": voters,
        } | ({"instructions": counted} if counted else {})
        json_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def cluster_table(rows: dict[int, dict[str, Any]]) -> str:
    """The markdown table of a --cluster-shards run (medians per size)."""
    lines = [
        "| S | pairs/s | cluster voter CPU µs/pair (sum of primaries; user) | each primary's share of it "
        "| commands/pair per primary | commands per event-loop cycle: primary / standalone "
        "| standalone voter CPU µs/pair; user | idle CPU ms/s per primary / standalone "
        "| p50 µs: cluster+2 / 3 standalone | p50 µs (client CPU µs per pair): cluster alone / 1 standalone |",
        "|---:|---:|---:|---|---|---|---:|---|---:|---:|",
    ]
    mean = statistics.mean
    for size, row in rows.items():
        shards, plains = row["us_per_pair"][:size], row["us_per_pair"][size:]
        user, idle, per_cycle = row["user_us_per_pair"], row["idle_ms_per_s"], row["commands_per_cycle"]
        total = sum(shards)
        share = " / ".join(f"{s / total:.2f}" for s in shards) if total > 0 else "-"
        commands = " / ".join(f"{c:.2f}" for c in row["commands_per_pair"][:size])
        lines.append(
            f"| {size} | {row['pairs_per_s']:.0f} | {total:.1f}; {sum(user[:size]):.1f} | {share} | {commands} "
            f"| {mean(per_cycle[:size]):.1f} / {mean(per_cycle[size:]):.1f} "
            f"| {mean(plains):.1f}; {mean(user[size:]):.1f} | {mean(idle[:size]):.1f} / {mean(idle[size:]):.1f} "
            f"| {row['p50_us_mixed']:.0f} / {row['p50_us_standalone']:.0f} "
            f"| {row['p50_us_cluster_alone']:.0f} ({row['client_cpu_us_cluster_alone']:.0f}) "
            f"/ {row['p50_us_standalone_alone']:.0f} ({row['client_cpu_us_standalone_alone']:.0f}) |"
        )
    return "\n".join(lines)


# -- --instructions: the same split, counted in instructions under callgrind (no load moves it) -------------

GRIND_TASKS = 64  # tasks per primary (per server for the standalone voter): every primary meets full batches
GRIND_PAIRS = 12  # pairs per task in the counted window, after GRIND_WARM per task uncounted
GRIND_WARM = 2
GRIND_SETTINGS: dict[str, Any] = {  # a primary under callgrind is ~50 times slower: no timeout may fire
    "ttl": 300.0,
    "node_timeout": 20.0,
    "adaptive_timeout": False,
    "connect_timeout": 60.0,
    "acquire_timeout": 300.0,
}


def _grind_wrapper(directory: str) -> str:
    """An executable that runs the server under callgrind, its profiles in *directory* (cg.PID.N per dump)."""
    path = os.path.join(directory, "server-under-callgrind")
    with open(path, "w") as script:
        script.write(
            f"#!/bin/sh\nexec valgrind --tool=callgrind -q --callgrind-out-file={shlex.quote(directory)}/cg.%p "
            f'{shlex.quote(server_binary())} "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


BY_THE_CLOCK = ("serverCron", "clusterReadHandler", "clusterWriteHandler", "infoCommand", "clusterCommand")
"""A server's work by the clock, not by the pair, left out of the counts: its cron (which runs clusterCron),
the cluster bus's gossip between nodes (more nodes, more of it; none for a standalone server), and the
client's ``INFO`` (the eviction policy's recheck) and ``CLUSTER SHARDS``/``SLOTS`` (the slot map's refresh),
each a few times a minute per server: a callgrind run is ~50 times slower than a live one, so these would
weigh ~50 times more per pair than they do live."""


def _pair_commands(node: Any) -> int:
    """The commands a server ran (``INFO commandstats``; the scripts' own calls included), less the ones
    that come by the clock (``INFO``, ``CLUSTER ...``)."""
    stats: Any = node.command("INFO", "commandstats")
    return sum(
        int(figures["calls"])
        for name, figures in stats.items()
        if name != "cmdstat_info" and not name.startswith("cmdstat_cluster")
    )


def _profile(path: str) -> tuple[int, int, int]:
    """(instructions, of them in BY_THE_CLOCK's functions (inclusive), calls of readQueryFromClient: the
    wake-ups that read a client's commands) of one callgrind dump."""
    with open(path) as profile:
        text = profile.read()
    total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    assert total is not None, path
    names: dict[str, str] = {}
    reads, callee = 0, ""
    for line in text.splitlines():
        if line.startswith("cfn="):
            ident, _, name = line[4:].partition(" ")
            callee = names.setdefault(ident, name) or names.get(ident, "")
        elif line.startswith("fn=") and " " in line:
            ident, _, name = line[3:].partition(" ")
            names[ident] = name
        elif line.startswith("calls=") and callee == "readQueryFromClient":
            reads += int(line[6:].split()[0])
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path], capture_output=True, text=True, check=True
    ).stdout
    clock = 0
    for name in BY_THE_CLOCK:
        found = re.search(rf"^\s*([\d,]+) \([^)]*\)\s+\S*:{name} \[", annotated, re.M)
        clock += int(found.group(1).replace(",", "")) if found else 0
    return int(total.group(1)), clock, reads


def _grind(directory: str, pids: list[int], zero: bool) -> list[tuple[int, int, int]]:
    """Zero (``callgrind_control -z``) or dump (``-d``) the counters of each process, one after the other;
    for dumps, each process's :func:`_profile` since its zero."""
    done: list[tuple[int, int, int]] = []
    for pid in pids:
        before = set(glob.glob(f"{directory}/cg.{pid}.*"))
        subprocess.run(["callgrind_control", "-z" if zero else "-d", str(pid)], capture_output=True, check=True)
        if not zero:
            (new,) = set(glob.glob(f"{directory}/cg.{pid}.*")) - before
            done.append(_profile(new))
            os.unlink(new)
    return done


async def _pairs(redlock: Redlock, tasks: int, each: int, tag: str) -> int:
    """*tasks* tasks doing *each* ``async with`` pairs, every pair on a name never used before."""

    async def worker(i: int) -> None:
        for n in range(each):
            async with redlock.lock(f"grind:{tag}:{i}:{n}"):
                pass

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return tasks * each


async def _grind_voter(url: str, nodes: list[Any], directory: str, tasks: int, each: int) -> dict[str, Any]:
    """One voter's servers under callgrind, counted: an idle window, then *tasks* tasks' pairs."""
    pids = [node.pid for node in nodes]
    async with Redlock([url], **GRIND_SETTINGS) as redlock:
        await _pairs(redlock, tasks, GRIND_WARM, "warm")  # scripts loaded, connections made
        before = [_pair_commands(node) for node in nodes]  # (read outside the counted window)
        await asyncio.to_thread(_grind, directory, pids, True)
        began = time.perf_counter()
        pairs = await _pairs(redlock, tasks, each, "run")
        took = time.perf_counter() - began
        counted = await asyncio.to_thread(_grind, directory, pids, False)
        sent = [_pair_commands(node) - b for node, b in zip(nodes, before, strict=True)]
    return {
        "pairs": pairs,
        "tasks": tasks,
        "seconds": took,
        "instructions_per_pair": [(total - clock) / pairs for total, clock, _ in counted],
        "by_the_clock_share": [clock / total for total, clock, _ in counted],
        "commands_per_pair": [c / pairs for c in sent],  # the scripts' own calls included
        "commands_per_read": [c / reads if reads else 0.0 for c, (_, _, reads) in zip(sent, counted, strict=True)],
    }


def grind_heading(pairs: int) -> str:
    return (
        f"Node instructions (valgrind --tool=callgrind; one voter at a time, every server of it under callgrind, "
        f"the voter alone in its Redlock): {GRIND_TASKS} tasks per primary, {pairs} pairs each on fresh names "
        f"after {GRIND_WARM} uncounted; less each server's cron and cluster bus (work by the clock)"
    )


def grind(sizes: list[int], pairs: int = GRIND_PAIRS) -> dict[str, dict[str, Any]]:
    """Node instructions per pair: one standalone voter, then one Cluster voter of S shards for each S (64
    tasks per primary), and the largest S again with 64 tasks in all (the batches shrink: what that costs)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (with callgrind_control) on PATH: apt-get install valgrind")
    shapes = [("standalone", 0, GRIND_TASKS), *((f"{s}", s, GRIND_TASKS * s) for s in sizes)]
    if max(sizes) > 1:
        shapes.append((f"{max(sizes)}, {GRIND_TASKS} tasks in all", max(sizes), GRIND_TASKS))
    rows: dict[str, dict[str, Any]] = {}
    # A server under callgrind takes seconds to answer its first PING (LocalNode allows START_TIMEOUT).
    with tempfile.TemporaryDirectory() as directory, mock.patch.object(server_process, "START_TIMEOUT", 120.0):
        wrapper = _grind_wrapper(directory)
        for name, size, tasks in shapes:
            with contextlib.ExitStack() as stack:
                if size == 0:
                    plain = stack.enter_context(LocalNodes(1, binary=wrapper))
                    node = plain.nodes[0]
                    node.command("SET", "redlock:", marker_value(_identity(node)[0], IN_SERVICE))
                    url, nodes = plain.urls[0], [node]
                else:
                    cluster = stack.enter_context(LocalCluster(size, 0, binary=wrapper, node_timeout=60.0))
                    mark_shards(cluster)
                    url, nodes = cluster.url, [cluster.master_of(i) for i in range(size)]
                rows[name] = asyncio.run(_grind_voter(url, nodes, directory, tasks, pairs))
            print(f"  counted: {name}", file=sys.stderr)
    return rows


def grind_table(rows: dict[str, dict[str, Any]]) -> str:
    """The markdown table of an --instructions run."""
    lines = [
        "| voter | tasks | pairs | node instructions per pair (sum over the voter's primaries) | vs standalone "
        "| each primary's share | commands per pair per primary | commands per read (a wake-up's batch) per primary "
        "| cron and cluster bus, left out |",
        "|---|---:|---:|---:|---:|---|---|---|---:|",
    ]
    base = sum(rows["standalone"]["instructions_per_pair"]) if "standalone" in rows else 0.0
    for name, row in rows.items():
        each = row["instructions_per_pair"]
        total = sum(each)
        label = "standalone" if name == "standalone" else f"cluster, S = {name}"
        lines.append(
            f"| {label} | {row['tasks']} | {row['pairs']} | {total:,.0f} | {total / base:.2f}x "
            f"| {' / '.join(f'{e / total:.2f}' for e in each)} "
            f"| {' / '.join(f'{c:.2f}' for c in row['commands_per_pair'])} "
            f"| {' / '.join(f'{c:.0f}' for c in row['commands_per_read'])} "
            f"| {max(row['by_the_clock_share']):.1%} |"
        )
    return "\n".join(lines)


def uvloop_run(work: Any) -> Any:
    import uvloop

    return uvloop.run(work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("settings", nargs="*", default=["", "queue=False"])
    parser.add_argument("--rounds", type=int, help="rounds (default 10; --cluster-shards: 3)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--scripts", action="store_true", help="the node CPU of one release script, per kind")
    parser.add_argument(
        "--cluster-shards",
        metavar="S,S,...",
        help="a Cluster voter of S shards (for each S) beside 2 standalone voters: pairs/s, each primary's CPU, p50",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="--cluster-shards: write the figures to PATH")
    parser.add_argument("--seconds", type=float, default=2.0, help="--cluster-shards: the timed window per size")
    parser.add_argument(
        "--tasks-per-shard",
        action="store_true",
        help=f"--cluster-shards: {CLUSTER_TASKS} tasks per shard (each primary meets the same batches), "
        f"not {CLUSTER_TASKS} in all",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        nargs="?",
        const=GRIND_PAIRS,
        default=0,
        metavar="PAIRS",
        help=f"--cluster-shards: then count each voter's node instructions per pair under callgrind, PAIRS pairs "
        f"per task (default {GRIND_PAIRS}), {GRIND_TASKS} tasks per primary",
    )
    args = parser.parse_args()
    if args.instructions and not args.cluster_shards:
        parser.error("--instructions counts the voters of --cluster-shards: give --cluster-shards 1,2,3 with it")
    if args.instructions and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        parser.error("--instructions needs valgrind (with callgrind_control) on PATH: apt-get install valgrind")
    if args.scripts:
        scripts()
        return 0
    if args.cluster_shards:
        try:
            sizes = [int(text) for text in args.cluster_shards.split(",")]
        except ValueError:
            parser.error(f"--cluster-shards takes shard counts like 1,2,3, got {args.cluster_shards!r}")
        if not all(1 <= size <= 16 for size in sizes) or not 0 < args.seconds <= 60:
            parser.error("--cluster-shards takes counts of 1 to 16 shards; --seconds more than 0, at most 60")
        rounds = 3 if args.rounds is None else args.rounds
        if not 1 <= rounds <= 20:
            parser.error(f"--rounds takes 1 to 20 with --cluster-shards, got {rounds}")
        if not 0 <= args.instructions <= 1000:
            parser.error(f"--instructions takes 1 to 1000 pairs per task (0: none), got {args.instructions}")
        cluster_shards(
            sorted(set(sizes)), args.seconds, args.loop, rounds, args.json, args.tasks_per_shard, args.instructions
        )
        return 0
    with LocalNodes(5) as nodes:
        work = concurrent(nodes.urls, args.settings, 10 if args.rounds is None else args.rounds)
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(work)
        else:
            asyncio.run(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
