"""redlock_async against the machine: a raw-Protocol Redlock reference, on 5 local nodes.

Usage::

    python benchmarks/bench_machine.py [--quick] [--json PATH] [--loop asyncio|uvloop|both]

"The machine" is the least a correct Redlock client on asyncio has to do,
written here with no help from redlock_async (issue 20, item 1):

* one ``asyncio.Protocol`` per node, a ``hiredis.Reader`` parsing the replies
  in ``data_received``, a ``deque`` of plain futures matched to the replies in
  order, and the writes of one loop turn batched into one ``transport.write``
  (one ``call_soon`` per turn and node);
* acquire: a fresh random token, ``SET key token NX PX 10000`` to all 5 nodes,
  the replies counted by done-callbacks as they come: decided at the third OK
  (acquired, if the elapsed time left validity: ttl minus a drift of 1% of the
  ttl plus 2 ms) or as soon as a majority can no longer be had (failed: the
  compare-and-delete script, EVALSHA, to every node, awaiting the nodes that
  said OK or had not answered);
* release: the same script to all 5 nodes, awaiting the nodes that granted; a
  late node's reply is just consumed by its FIFO (the release follows the SET
  on the same connection, so it deletes the late node's copy too).

No per-node deadline, no ballot object, no watchdog, no retries: what is left
is the wire, the parser and the event loop. redlock_async runs with its default
settings (``Redlock(urls)``), one ``Lock`` per resource, ``acquire(blocking=False)``
then ``release()`` (bench_core's RedlockSide).

Measured in rounds, the order of the two sides alternating from round to round,
each phase after a short warm-up of the same side:

1. throughput of 64 and of 512 tasks, each task on its own resource,
   acquire+release in a loop (pairs/s), and the client's CPU per pair
   (``time.process_time()`` over the phase / pairs);
2. uncontended acquire+release latency, one task, sequential (p50, p99).

Every figure is the median over the rounds of each side; each ratio
(redlock_async/machine) is taken within a round, then the median over rounds.
After the rounds, each side runs a short exclusion check: 16 tasks of 4
clients (each with connections of its own) contending for ONE resource, each
grant checked in-process for an overlap with another holder.

Exit status 1 when an acquire failed that should not have: any of the
machine's, or one of redlock_async's that a node refused (every task has a
resource of its own, so a refusal is a lease left behind); when a granted
node's release found the key no longer the holder's; or when the exclusion
check saw an overlap or no grant. redlock_async's acquires that failed on its
node timeout (a loop lagging under 512 tasks answers late) are counted and
printed, not an error. The targets (throughput ratio >= 0.8, CPU per pair
ratio <= 1.3) are printed, not enforced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import secrets
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import hiredis
from _common import LOOPS, run_on
from _peers import pack
from bench_core import (
    RELEASE_LUA,
    TOKEN_BYTES,
    TTL_MS,
    Floor,
    Latency,
    RedlockSide,
    Side,
    Throughput,
    _spread,
    environment,
    measure_latency,
    median_of,
    run_throughput,
)

from redlock_async import Lock, Redlock, Vote
from redlock_async.testing import LocalNodes

NODES = 5
QUORUM = NODES // 2 + 1
DRIFT_MS = TTL_MS * 0.01 + 2  # clock drift allowed for, as the Redlock algorithm states it
VALID_NS = int((TTL_MS - DRIFT_MS) * 1e6)  # an acquire that took longer has no validity left
TASK_COUNTS = (64, 512)  # the throughput phases
CPU_TASKS = 64  # the phase whose CPU per pair the target is judged on
EXCLUSION_CLIENTS = 4  # clients of the exclusion check (each side), each with connections of its own
EXCLUSION_TASKS = 16  # contenders of the exclusion check, spread over its clients
HOLD_S = 0.001  # how long a contender of the exclusion check holds the lock: a few round trips of the others

TARGET_THROUGHPUT_RATIO = 0.8  # redlock_async pairs/s >= 0.8x the machine's
TARGET_CPU_RATIO = 1.3  # redlock_async client CPU per pair <= 1.3x the machine's

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    rounds: int
    latency_ops: int  # timed sequential ops per side per round
    warmup_ops: int  # untimed sequential ops before each latency run
    throughput_seconds: float  # timed window per side, task count and round
    throughput_warmup_seconds: float  # untimed window before each timed one (same side and task count)
    max_ops_per_task: int  # hard bound on a throughput worker's loop
    phase_seconds: float  # hard bound (asyncio.timeout) on any one phase
    exclusion_seconds: float  # the exclusion check, per side


FULL = Config(
    rounds=6,
    latency_ops=2000,
    warmup_ops=200,
    throughput_seconds=1.7,
    throughput_warmup_seconds=0.15,
    max_ops_per_task=1_000_000,
    phase_seconds=60.0,
    exclusion_seconds=0.5,
)
QUICK = Config(
    rounds=2,
    latency_ops=300,
    warmup_ops=50,
    throughput_seconds=0.5,
    throughput_warmup_seconds=0.1,
    max_ops_per_task=200_000,
    phase_seconds=15.0,
    exclusion_seconds=0.25,
)


# -- the machine -------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One node: replies parsed by hiredis and matched in order to a FIFO of futures; one write per loop turn.

    Every future gets a value, never an exception: a reply (bytes, int, None), hiredis's ReplyError
    for an error reply, or a ConnectionError once the connection is gone.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.outgoing: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            if not future.done():  # never awaited directly, so never cancelled: a guard only
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        gone = ConnectionError(f"connection lost: {exc!r}")
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(gone)
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Queue *command* (RESP bytes) for this turn's write; the future gets its reply."""
        future = self.loop.create_future()
        if self.transport is None:
            future.set_result(ConnectionError("not connected"))
            return future
        self.waiting.append(future)
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(command)
        return future

    def flush(self) -> None:
        if self.transport is not None:
            self.transport.write(b"".join(self.outgoing))
        self.outgoing.clear()


def _all_done(loop: asyncio.AbstractEventLoop, futures: Sequence[asyncio.Future[Any]]) -> asyncio.Future[None]:
    """A future done once all of *futures* are: one wake-up of the awaiting task, not one per reply."""
    done: asyncio.Future[None] = loop.create_future()
    pending = [f for f in futures if not f.done()]
    remaining = len(pending)

    def count(_: asyncio.Future[Any]) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    if remaining == 0:
        done.set_result(None)
    for future in pending:
        future.add_done_callback(count)
    return done


class Machine:
    """Redlock on raw connections: quorum of SET NX PX, compare-and-delete release. Nothing else."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: list[Connection], release_sha: bytes) -> None:
        self.loop = loop
        self.connections = connections
        self.release_sha = release_sha

    @classmethod
    async def connect(cls, urls: Sequence[str]) -> Machine:
        loop = asyncio.get_running_loop()
        connections: list[Connection] = []
        for url in urls:
            parts = urllib.parse.urlsplit(url)  # redis://127.0.0.1:PORT, as LocalNodes gives them
            host, port = parts.hostname or "127.0.0.1", parts.port or 6379
            _, connection = await loop.create_connection(lambda: Connection(loop), host, port)
            connections.append(connection)
        load = pack((b"SCRIPT", b"LOAD", RELEASE_LUA))
        shas = await asyncio.gather(*(c.send(load) for c in connections))
        if len(set(shas)) != 1 or not isinstance(shas[0], bytes):
            raise RuntimeError(f"SCRIPT LOAD answered {shas!r}")
        return cls(loop, connections, shas[0])

    async def aclose(self) -> None:
        for connection in self.connections:
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.gather(*(c.closed for c in self.connections))

    def _send_release(self, key: str, token: str) -> list[asyncio.Future[Any]]:
        command = pack((b"EVALSHA", self.release_sha, 1, key, token))
        return [c.send(command) for c in self.connections]

    async def acquire(self, key: str) -> tuple[str, list[int]] | None:
        """One attempt: (token, indices of the nodes that granted) once a majority said OK in time, else None."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        command = pack((b"SET", key, token, b"NX", b"PX", TTL_MS))
        started = perf_ns()
        replies = [c.send(command) for c in self.connections]
        decided: asyncio.Future[bool] = self.loop.create_future()
        yes = no = 0

        def count(reply: asyncio.Future[Any]) -> None:
            nonlocal yes, no
            if decided.done():
                return
            if reply.result() == b"OK":
                yes += 1
                if yes == QUORUM:
                    decided.set_result(True)
            else:
                no += 1
                if no > NODES - QUORUM:
                    decided.set_result(False)

        for reply in replies:
            reply.add_done_callback(count)
        if await decided and perf_ns() - started < VALID_NS:
            return token, [i for i, reply in enumerate(replies) if reply.done() and reply.result() == b"OK"]
        # Undo: delete the key wherever it may have been set (an OK, or no answer yet).
        undo = self._send_release(key, token)
        await _all_done(
            self.loop,
            [u for u, reply in zip(undo, replies, strict=True) if not reply.done() or reply.result() == b"OK"],
        )
        return None

    async def release(self, key: str, token: str, granted: Sequence[int]) -> int:
        """Delete the key where it is still *token*'s, awaiting the nodes that granted; how many no longer had it."""
        futures = self._send_release(key, token)
        held = [futures[i] for i in granted]
        await _all_done(self.loop, held)
        return sum(future.result() != 1 for future in held)


class MachineSide:
    """The machine on resources of its own, with the cycle() of bench_core's sides."""

    name = "machine"

    def __init__(self, machine: Machine, slots: int) -> None:
        self.machine = machine
        self.keys = [f"bench:machine:{i}" for i in range(slots)]
        self.failures = 0  # failed acquires in every op, warm-ups included
        self.lost = 0  # granted nodes whose release found the key no longer this holder's

    async def cycle(self, slot: int) -> tuple[int, int, bool]:
        key = self.keys[slot]
        started = perf_ns()
        grant = await self.machine.acquire(key)
        acquired = perf_ns()
        if grant is None:
            self.failures += 1
        else:
            self.lost += await self.machine.release(key, *grant)
        return acquired - started, perf_ns() - started, grant is not None


class CountedRedlockSide(RedlockSide):
    """bench_core's RedlockSide, with its failed acquires told apart by the nodes' votes.

    Every task has a resource of its own, so a node that said no (the key held) means a lease was left
    behind: unexpected. A failure with no refusal is the library giving up on nodes whose replies came
    after its node timeout (0.05 s by default), which a loop lagging under 512 tasks can cause.
    """

    def __init__(self, redlock: Redlock, slots: int) -> None:
        super().__init__(redlock, slots)
        self.refused = 0  # failed acquires where a node said no
        self.timed_out = 0  # failed acquires without a refusal (node timeouts, errors, skipped nodes)

    async def cycle(self, slot: int) -> tuple[int, int, bool]:
        acquire_ns, cycle_ns, ok = await super().cycle(slot)
        if not ok:
            if any(outcome.vote is Vote.NO for outcome in self.locks[slot].outcomes):
                self.refused += 1
            else:
                self.timed_out += 1
        return acquire_ns, cycle_ns, ok


# -- phases -------------------------------------------------------------------------


@dataclass
class Load(Throughput):
    tasks: int = 0
    cpu_seconds: float = 0.0  # time.process_time() over the timed window
    cpu_us_per_pair: float = 0.0


async def measure_load(side: Side, tasks: int, cfg: Config) -> Load:
    """*tasks* tasks, each on its own resource: warm up, then time the window and the process's CPU in it."""
    await run_throughput(side, cfg.throughput_warmup_seconds, cfg, tasks)
    gc.collect()
    cpu = time.process_time()
    measured = await run_throughput(side, cfg.throughput_seconds, cfg, tasks)
    cpu = time.process_time() - cpu
    return Load(
        **dataclasses.asdict(measured),
        tasks=tasks,
        cpu_seconds=cpu,
        cpu_us_per_pair=cpu / measured.ops * 1e6 if measured.ops else float("nan"),
    )


# One attempt of a contender: a release callable when granted, None when refused.
Attempt = Callable[[], Awaitable[Callable[[], Awaitable[Any]] | None]]


@dataclass
class Exclusion:
    clients: int
    tasks: int
    attempts: int = 0
    grants: int = 0
    overlaps: int = 0  # grants made while another contender held the lock


async def check_exclusion(attempts: Sequence[Attempt], cfg: Config) -> Exclusion:
    """One task per attempt function, all on ONE resource; every grant checked against the holder of the moment."""
    result = Exclusion(clients=EXCLUSION_CLIENTS, tasks=len(attempts))
    holder: int | None = None
    stop_at = perf_ns() + int(cfg.exclusion_seconds * 1e9)

    async def contender(task: int, attempt: Attempt) -> None:
        nonlocal holder
        while perf_ns() < stop_at:
            result.attempts += 1
            release = await attempt()
            if release is None:
                continue
            result.grants += 1
            if holder is not None:
                result.overlaps += 1
            holder = task
            await asyncio.sleep(HOLD_S)  # others' attempts come and go meanwhile
            if holder != task:
                result.overlaps += 1
            holder = None
            await release()

    async with asyncio.timeout(cfg.exclusion_seconds + cfg.phase_seconds):
        await asyncio.gather(*(contender(task, attempt) for task, attempt in enumerate(attempts)))
    return result


def machine_attempt(machine: Machine, key: str) -> Attempt:
    async def attempt() -> Callable[[], Awaitable[int]] | None:
        grant = await machine.acquire(key)
        if grant is None:
            return None
        token, granted = grant
        return lambda: machine.release(key, token, granted)

    return attempt


def lock_attempt(lock: Lock) -> Attempt:
    async def attempt() -> Callable[[], Awaitable[None]] | None:
        return lock.release if await lock.acquire(blocking=False) else None

    return attempt


async def check_exclusions(urls: Sequence[str], cfg: Config) -> dict[str, Exclusion]:
    """Each side's exclusion check: EXCLUSION_CLIENTS clients of its own, EXCLUSION_TASKS tasks spread over them.

    Clients of their own, each with its own connections: the nodes then see the contenders' SETs in
    different orders, as they do from separate processes (one client's SETs reach every node in one order).
    """
    results: dict[str, Exclusion] = {}
    machines = [await Machine.connect(urls) for _ in range(EXCLUSION_CLIENTS)]
    try:
        results["machine"] = await check_exclusion(
            [
                machine_attempt(machines[t % EXCLUSION_CLIENTS], "bench:machine:exclusion")
                for t in range(EXCLUSION_TASKS)
            ],
            cfg,
        )
    finally:
        await asyncio.gather(*(m.aclose() for m in machines))
    async with contextlib.AsyncExitStack() as stack:
        redlocks = [await stack.enter_async_context(Redlock(urls)) for _ in range(EXCLUSION_CLIENTS)]
        results["redlock_async"] = await check_exclusion(
            [lock_attempt(redlocks[t % EXCLUSION_CLIENTS].lock("bench:exclusion")) for t in range(EXCLUSION_TASKS)],
            cfg,
        )
    return results


# -- rounds and report --------------------------------------------------------------


@dataclass
class SideRound:
    latency: Latency
    loads: list[Load]

    def figures(self) -> dict[str, float]:
        """Every figure of the side in this round, by name (the names of the medians and the ratios)."""
        out = {
            "cycle_p50_us": self.latency.cycle_p50_us,
            "cycle_p99_us": self.latency.cycle_p99_us,
            "acquire_p50_us": self.latency.acquire_p50_us,
        }
        for load in self.loads:
            out[f"throughput_{load.tasks}_pairs_per_s"] = load.ops_per_s
            out[f"cpu_us_per_pair_{load.tasks}"] = load.cpu_us_per_pair
        return out


@dataclass
class Round:
    order: list[str]
    sides: dict[str, SideRound]
    seconds: float = 0.0
    ratios: dict[str, float] = field(default_factory=dict)  # redlock_async / machine, per figure


async def run_round(index: int, machine: MachineSide, redlock: CountedRedlockSide, cfg: Config) -> Round:
    started = perf_ns()
    sides: list[Side] = [machine, redlock] if index % 2 == 0 else [redlock, machine]
    loads: dict[str, list[Load]] = {s.name: [] for s in sides}
    for tasks in TASK_COUNTS:
        for s in sides:
            loads[s.name].append(await measure_load(s, tasks, cfg))
    latency = {s.name: await measure_latency(s, cfg) for s in sides}
    result = Round(
        order=[s.name for s in sides], sides={s.name: SideRound(latency[s.name], loads[s.name]) for s in sides}
    )
    ours, theirs = result.sides[redlock.name].figures(), result.sides[machine.name].figures()
    result.ratios = {name: ours[name] / theirs[name] for name in theirs}
    result.seconds = (perf_ns() - started) / 1e9
    return result


async def keys_left(machine: Machine) -> list[int]:
    """The benchmark's keys still on each node (none, once every release landed)."""
    await asyncio.sleep(0.2)  # a late node's delete lands a moment after the release returned
    pattern = pack((b"KEYS", b"*bench:*"))
    replies = await asyncio.gather(*(c.send(pattern) for c in machine.connections))
    return [len(reply) if isinstance(reply, list) else -1 for reply in replies]


async def bench(urls: Sequence[str], loop_name: str, cfg: Config) -> dict[str, Any]:
    started = perf_ns()
    slots = max(TASK_COUNTS)
    machine = await Machine.connect(urls)
    try:
        async with Redlock(urls) as redlock:
            floor = Floor(urls, 0)  # only to ask the server's version, as bench_core reports it
            try:
                env = await environment(floor, redlock)
            finally:
                await floor.aclose()
            env["loop"] = loop_name
            ours, theirs = CountedRedlockSide(redlock, slots), MachineSide(machine, slots)
            rounds: list[Round] = []
            for index in range(cfg.rounds):
                result = await run_round(index, theirs, ours, cfg)
                rounds.append(result)
                r = result.ratios
                print(
                    f"{loop_name} round {index + 1}/{cfg.rounds}: {result.seconds:.1f} s, throughput ratio "
                    f"{r['throughput_64_pairs_per_s']:.2f}x (64) {r['throughput_512_pairs_per_s']:.2f}x (512), "
                    f"CPU/pair ratio {r['cpu_us_per_pair_64']:.2f}x, p50 ratio {r['cycle_p50_us']:.2f}x",
                    file=sys.stderr,
                    flush=True,
                )
            exclusion = await check_exclusions(urls, cfg)
            failures: dict[str, dict[str, Any]] = {
                theirs.name: {"acquire": theirs.failures, "lost": theirs.lost},
                ours.name: {
                    "acquire": ours.failures,
                    "refused": ours.refused,
                    "timed_out": ours.timed_out,
                    "first": ours.failed[:3],
                },
            }
            left = await keys_left(machine)
    finally:
        await machine.aclose()
    return summarise(rounds, env, cfg, exclusion, failures, left, (perf_ns() - started) / 1e9)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def summarise(
    rounds: list[Round],
    env: dict[str, Any],
    cfg: Config,
    exclusion: dict[str, Exclusion],
    failures: dict[str, dict[str, Any]],
    left: list[int],
    total_seconds: float,
) -> dict[str, Any]:
    names = list(rounds[0].sides)
    figures = list(rounds[0].ratios)
    medians = {
        side: {name: median_of([r.sides[side].figures()[name] for r in rounds]) for name in figures} for side in names
    }
    ratios = {name: median_of([r.ratios[name] for r in rounds]) for name in figures}
    met = {
        f"throughput_{n}_pairs_per_s": ratios[f"throughput_{n}_pairs_per_s"] >= TARGET_THROUGHPUT_RATIO
        for n in TASK_COUNTS
    }
    met[f"cpu_us_per_pair_{CPU_TASKS}"] = ratios[f"cpu_us_per_pair_{CPU_TASKS}"] <= TARGET_CPU_RATIO
    ok = (
        failures["machine"]["acquire"] == 0
        and failures["machine"]["lost"] == 0
        and failures["redlock_async"]["refused"] == 0
        and all(e.overlaps == 0 and e.grants > 0 for e in exclusion.values())
    )

    def target(name: str) -> str:
        if name not in met:
            return ""
        bound = f">= {TARGET_THROUGHPUT_RATIO}x" if name.startswith("throughput") else f"<= {TARGET_CPU_RATIO}x"
        return f"{bound}: {_met(met[name])}"

    labels = {
        **{f"throughput_{n}_pairs_per_s": f"throughput, {n} tasks (pairs/s)" for n in TASK_COUNTS},
        **{f"cpu_us_per_pair_{n}": f"client CPU per pair, {n} tasks (µs)" for n in TASK_COUNTS},
        "cycle_p50_us": "uncontended acquire+release p50 (µs)",
        "cycle_p99_us": "uncontended acquire+release p99 (µs)",
        "acquire_p50_us": "uncontended acquire only p50 (µs)",
    }
    f0, f1, f2 = "{:.0f}".format, "{:.1f}".format, "{:.2f}".format
    print()
    print(f"## redlock_async against the machine ({'quick' if cfg is QUICK else 'full'}, {len(rounds)} rounds)")
    print()
    print(
        f"python {env['python']} ({env['implementation']}), hiredis {env['hiredis']}, server {env['server']}, "
        f"cpu_count {env['cpu_count']} (affinity {env['cpu_affinity']}), {env['nodes']} nodes, --loop {env['loop']} "
        f"({env['event_loop']}), redlock_async at {env['commit']}"
    )
    print()
    print("| figure | machine | redlock_async | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for name, label in labels.items():
        fmt = f1 if name.startswith("cpu") else f0
        print(
            f"| {label} | {fmt(medians['machine'][name])} | {fmt(medians['redlock_async'][name])} "
            f"| {f2(ratios[name])}x | {target(name)} |"
        )
    print()
    print(
        "Medians over rounds; each ratio is redlock_async/machine within a round, median over rounds. CPU is "
        f"time.process_time() of this process over the timed window / pairs; its target is judged at {CPU_TASKS} tasks."
    )
    print()
    print(
        "| round | order | pairs/s 64: machine / redlock | pairs/s 512 | CPU µs/pair 64 | CPU µs/pair 512 "
        "| p50 µs | p99 µs | failed acquires | max loop lag ms | round s |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(rounds):
        m, o = r.sides["machine"], r.sides["redlock_async"]
        fm, fo = m.figures(), o.figures()

        def pair(name: str, fmt: Callable[[float], str], fm: dict[str, float] = fm, fo: dict[str, float] = fo) -> str:
            return f"{fmt(fm[name])} / {fmt(fo[name])}"

        lag = max(load.max_loop_lag_ms for load in m.loads + o.loads)
        failed = [s.latency.failures + sum(load.failures for load in s.loads) for s in (m, o)]
        print(
            f"| {i + 1} | {'>'.join(r.order)} | {pair('throughput_64_pairs_per_s', f0)} "
            f"| {pair('throughput_512_pairs_per_s', f0)} | {pair('cpu_us_per_pair_64', f1)} "
            f"| {pair('cpu_us_per_pair_512', f1)} | {pair('cycle_p50_us', f0)} | {pair('cycle_p99_us', f0)} "
            f"| {failed[0]} / {failed[1]} | {f0(lag)} | {r.seconds:.1f} |"
        )
    print()
    print(
        "Range of per-round ratios: "
        + "; ".join(f"{labels[name]} {_spread([r.ratios[name] for r in rounds], f2)}" for name in met)
    )
    print(
        f"Failed acquires (every op, warm-ups included): machine {failures['machine']['acquire']}, "
        f"redlock_async {failures['redlock_async']['acquire']} ({failures['redlock_async']['refused']} refused by a "
        f"node, {failures['redlock_async']['timed_out']} on its node timeout); machine releases that found the key "
        f"gone: {failures['machine']['lost']}. Exclusion check ({EXCLUSION_TASKS} tasks of {EXCLUSION_CLIENTS} clients "
        f"on one resource, {cfg.exclusion_seconds:g} s): "
        + ", ".join(
            f"{k} {e.grants} grants of {e.attempts} attempts, {e.overlaps} overlaps" for k, e in exclusion.items()
        )
        + f". Keys left per node: {left}. {'OK' if ok else 'FAILED'}. Total {total_seconds:.1f} s."
    )
    return {
        "config": dataclasses.asdict(cfg),
        "environment": env,
        "medians": medians,
        "ratios": ratios,
        "targets": {"throughput_ratio_min": TARGET_THROUGHPUT_RATIO, "cpu_per_pair_ratio_max": TARGET_CPU_RATIO},
        "met": met,
        "failures": failures,
        "exclusion": {k: dataclasses.asdict(e) for k, e in exclusion.items()},
        "keys_left": left,
        "ok": ok,
        "total_seconds": total_seconds,
        "rounds": [dataclasses.asdict(r) for r in rounds],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 short rounds, for smoke runs (< 30 s on both loops)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures to PATH")
    parser.add_argument(
        "--loop",
        choices=(*LOOPS, "both"),
        default="both",
        help="event loop: asyncio, uvloop, or both (the default), one after the other on the same nodes",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    results = {}
    with LocalNodes(NODES) as cluster:
        for loop in loops:
            results[loop] = run_on(loop, bench(cluster.urls, loop, cfg))
    if args.json is not None:
        data = results[loops[0]] if len(loops) == 1 else results
        args.json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0 if all(result["ok"] for result in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
