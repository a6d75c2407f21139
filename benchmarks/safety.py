"""The safety report: mutual exclusion under faults, scenario by scenario, on real nodes.

    .venv/bin/python benchmarks/safety.py             # writes docs/safety.md (about four minutes)
    .venv/bin/python benchmarks/safety.py --seconds 2 --print

Every scenario starts 5 fresh proxied nodes, runs 4 Redlock clients x 3
tasks contending for one fenced lock, or for one of the other primitives (grant
queue, lock_many, semaphore, election), (ttl 1 s, ~1 ms critical sections) for
a few seconds while a fault runs, records every critical section, and checks
the history: overlapping sections and fencing tokens that went backwards.
Afterwards, with the faults healed, no lock key may be left on any node.

Each scenario says what it expects: most must have zero violations and keep
granting; the majority faults must grant nothing; and one, with the restart
quarantine turned off, shows the hazard the quarantine exists for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _clock_faults import ClockOutcome, clock_matrix, render_clock, unavailable
from _common import ROOT, library_commit

from redlock_async import LockNotAcquired, Redlock
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._soak import soak

NODES = 5
CLIENTS = 4
TASKS = 3
TTL = 1.0
RESOURCE = "safety"
QUARANTINE = 1.5  # with ttl 1 s: covers every lease, and lets the scenario cycle restarts

Fault = Callable[[LocalNodes, float, random.Random], Awaitable[list[str]]]


@dataclass
class Outcome:
    name: str
    expect: str
    attempts: int = 0
    granted: int = 0
    overlaps: int = 0
    regressions: int = 0
    leftover: int = 0
    faults: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        if self.expect == "safe":
            return self.overlaps == 0 and self.regressions == 0 and self.granted > 0 and self.leftover == 0
        if self.expect == "no grants":
            return self.granted == 0 and self.leftover == 0
        return self.overlaps > 0  # "hazard": the checker must see what the analysis predicts


# -- faults: each runs until *until* (monotonic), and says what it did ---------------------------------------


async def no_fault(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
    await asyncio.sleep(max(0.0, until - time.monotonic()))
    return []


def _minority(rng: random.Random) -> list[int]:
    return rng.sample(range(NODES), 2)


async def pause_minority(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
    done = []
    while time.monotonic() < until - 0.4:
        down = _minority(rng)
        for i in down:
            nodes[i].pause()
        await asyncio.sleep(0.3)
        for i in down:
            nodes[i].resume()
        done.append(f"pause {down}")
        await asyncio.sleep(0.1)
    return done


def _restarts(keep_data: bool) -> Fault:
    async def restart(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
        done = []
        while time.monotonic() < until - 0.5:
            i = rng.randrange(NODES)
            await asyncio.to_thread(nodes[i].restart, keep_data=keep_data)
            done.append(f"restart {i}" + ("" if keep_data else " (wiped)"))
            # One node in quarantine at a time: a minority out, never more.
            await asyncio.sleep(QUARANTINE + 0.2)
        return done

    return restart


def _proxy_fault(kind: str, count: int, hold: float, gap: float) -> Fault:
    async def run(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
        done = []
        while time.monotonic() < until - hold:
            chosen = rng.sample(range(NODES), count)
            for i in chosen:
                proxy = nodes[i].proxy
                if kind == "blackhole":
                    proxy.blackhole(duration=hold)
                elif kind == "drop":
                    proxy.drop_replies(duration=hold)
                else:
                    proxy.latency(0.1, duration=hold)  # 2 x 100 ms a round trip: beyond the 50 ms node timeout
            done.append(f"{kind} {chosen}")
            await asyncio.sleep(hold + gap)
        for i in range(NODES):
            nodes[i].proxy.heal()
        return done

    return run


async def pause_majority(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
    down = [0, 1, 2]
    for i in down:
        nodes[i].pause()
    try:
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    finally:
        for i in down:
            nodes[i].resume()
    return [f"pause {down} throughout"]


async def blackhole_majority(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
    down = [2, 3, 4]
    for i in down:
        nodes[i].proxy.blackhole()
    try:
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    finally:
        for i in down:
            nodes[i].proxy.heal()
    return [f"blackhole {down} throughout"]


# -- one scenario -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """One name held, as History records it: an acquisition's token and that name's fencing token."""

    token: str | None
    fencing_token: int | None


MANY_NAMES = (f"{RESOURCE}:a", f"{RESOURCE}:b", f"{RESOURCE}:c")  # lock_many takes two of these, any two overlap
SEMAPHORE_LIMIT = 2


async def one_turn(primitive: str, redlock: Redlock, who: str, histories: dict[str, History], outcome: Outcome) -> None:
    """One acquisition of *primitive* by *who*: its critical section recorded per name, ~1 ms inside."""
    outcome.attempts += 1
    body = random.uniform(0.0, 0.002)
    if primitive == "election":
        try:
            async with redlock.election(RESOURCE).campaign(timeout=0.5) as term:
                outcome.granted += 1
                with histories[RESOURCE].section(who, Holding(f"term {term}", term)):
                    await asyncio.sleep(body)
        except LockNotAcquired:
            pass
        return
    if primitive == "lock_many":
        lock = redlock.lock_many(random.sample(MANY_NAMES, 2), ttl=TTL)
    elif primitive == "semaphore":
        lock = redlock.semaphore(RESOURCE, limit=SEMAPHORE_LIMIT, ttl=TTL)
    else:
        lock = redlock.lock(RESOURCE, ttl=TTL)
    if not await lock.acquire():
        return
    outcome.granted += 1
    try:
        tokens = lock.fencing_tokens or {}
        with contextlib.ExitStack() as inside:
            for held in lock.names:
                key = held.decode() if isinstance(held, bytes) else held
                inside.enter_context(histories[key].section(who, Holding(lock.token, tokens.get(held))))
            await asyncio.sleep(body)
    finally:
        await lock.release()


async def contend(
    name: str, expect: str, fault: Fault, seconds: float, seed: int, primitive: str = "lock", **settings: Any
) -> Outcome:
    outcome = Outcome(name, expect)
    rng = random.Random(seed)
    histories = {key: History() for key in (*MANY_NAMES, RESOURCE)}
    began = time.monotonic()
    with LocalNodes(NODES, proxied=True) as nodes:
        # Fenced where the primitive can be (semaphores have no fencing tokens); the grant queue is fenced too.
        fenced = primitive in ("lock", "lock_many", "election")
        redlocks = [
            Redlock(nodes.urls, fencing=fenced, retry_delay=0.02, acquire_timeout=0.5, **settings)
            for _ in range(CLIENTS)
        ]
        for redlock in redlocks:
            await redlock.connect()
        # The fault runs until *until*; no attempt starts later than an acquire timeout before it,
        # so every attempt meets the fault (a majority fault must see no grant at all).
        until = time.monotonic() + seconds
        last_start = until - 0.6

        async def worker(client: int, task: int, redlock: Redlock) -> None:
            while time.monotonic() < last_start:
                await one_turn(primitive, redlock, f"client{client}.{task}", histories, outcome)

        try:
            async with asyncio.timeout(seconds + 30):
                results = await asyncio.gather(
                    fault(nodes, until, rng),
                    *(worker(c, t, redlocks[c]) for c in range(CLIENTS) for t in range(TASKS)),
                )
            outcome.faults = list(results[0] or ())
        finally:
            for redlock in redlocks:
                await redlock.aclose()
        # Faults healed: whatever is left must expire or be gone. Leases live at most a ttl, the
        # grant queue's lines and a semaphore's limit a ttl and its drift after their last use.
        await asyncio.sleep(2 * TTL + 0.2)
        outcome.leftover = sum(len(leftovers(nodes, i)) for i in range(NODES))
    limit = SEMAPHORE_LIMIT if primitive == "semaphore" else 1
    for history in histories.values():
        if limit == 1:
            outcome.overlaps += len(history.overlaps())
            outcome.regressions += len(history.fencing_regressions())
        else:
            outcome.overlaps += sum(1 for _, inside in history.crowds() if len(inside) > limit)
    outcome.seconds = time.monotonic() - began
    return outcome


def leftovers(nodes: LocalNodes, i: int) -> list[bytes]:
    """Keys left on node *i* under the lock prefix: any lease, line or permit (not the restart quarantine's
    marker, the prefix itself, nor a semaphore's limit, which is kept on purpose)."""
    keys: list[bytes] = nodes[i].command("KEYS", "redlock:?*")  # type: ignore[assignment]
    return [key for key in keys if not key.endswith(b"\x00limit")]


async def analysis_sequence(quarantine: float | None, rounds: int) -> Outcome:
    """A holds 0, 1, 2; node 2 restarts empty; B asks all five (the analysis's sequence), *rounds* times."""
    name = "analysis sequence, quarantine " + ("off" if quarantine == 0 else "on")
    outcome = Outcome(name, "hazard" if quarantine == 0 else "safe")
    history = History()
    began = time.monotonic()
    key = f"redlock:{RESOURCE}"
    with LocalNodes(NODES, proxied=True) as nodes:
        for n in range(rounds):
            # ttl=TTL: the default quarantine follows the largest ttl in use, the Redlock's own at first.
            extra: dict[str, Any] = {"ttl": TTL}
            if quarantine is not None:
                extra["restart_quarantine"] = quarantine
            async with Redlock(nodes.urls, **extra) as a:
                for i in (3, 4):
                    nodes[i].command("SET", key, "someone else", "PX", 60_000)
                held = a.lock(RESOURCE, ttl=TTL, auto_extend=False)
                outcome.attempts += 1
                granted = await held.acquire(blocking=False)
                for i in (3, 4):
                    nodes[i].command("DEL", key)
                if not granted:
                    continue
                outcome.granted += 1
                await asyncio.to_thread(nodes[2].restart, keep_data=False)
                async with Redlock(nodes.urls, **extra) as b:
                    lock = b.lock(RESOURCE, ttl=TTL)
                    outcome.attempts += 1
                    if await lock.acquire(blocking=False):
                        outcome.granted += 1
                        with history.section(f"A{n}", held), history.section(f"B{n}", lock):
                            pass
                        await lock.release()
                await held.release()
            outcome.faults.append(f"restart 2 (wiped) under A's lease #{n}")
            await asyncio.sleep(2 * TTL + 0.1)  # A's lease and node 2's quarantine over before the next round
        outcome.leftover = sum(int(nodes[i].command("EXISTS", key)) for i in range(NODES))  # type: ignore[call-overload]
    outcome.overlaps = len(history.overlaps())
    outcome.seconds = time.monotonic() - began
    return outcome


async def processes(count: int, seconds: float) -> Outcome:
    """*count* OS processes x 3 tasks, each its own Redlock, under minority pauses, wipes and slow nodes."""
    began = time.monotonic()
    result = await soak(count, seconds)
    outcome = Outcome(f"{count} OS processes x 3 tasks: minority paused, wiped, slowed in turn", "safe")
    outcome.attempts = outcome.granted = result.sections  # each process reports its grants, not its tries
    outcome.overlaps, outcome.regressions, outcome.leftover = result.overlaps, result.regressions, result.leftover
    outcome.faults = result.faults
    outcome.seconds = time.monotonic() - began
    return outcome


SCENARIOS: list[tuple[str, str, Fault, dict[str, Any]]] = [
    ("no fault", "safe", no_fault, {}),
    ("minority paused (SIGSTOP 2 of 5, 0.3 s at a time)", "safe", pause_minority, {}),
    ("minority restarted, data kept", "safe", _restarts(True), {"restart_quarantine": QUARANTINE}),
    ("minority restarted, data lost", "safe", _restarts(False), {"restart_quarantine": QUARANTINE}),
    ("minority black-holed (proxy, 0.4 s at a time)", "safe", _proxy_fault("blackhole", 2, 0.4, 0.1), {}),
    ("minority replies dropped after the command ran", "safe", _proxy_fault("drop", 2, 0.4, 0.1), {}),
    ("minority slow (+200 ms a round trip, node timeout 50 ms)", "safe", _proxy_fault("slow", 2, 0.5, 0.1), {}),
    ("majority paused (3 of 5) throughout", "no grants", pause_majority, {}),
    ("majority black-holed (3 of 5) throughout", "no grants", blackhole_majority, {}),
]

PRIMITIVES: list[tuple[str, dict[str, Any]]] = [  # (primitive, Redlock settings), each under the faults below
    ("grant queue (`queue=True`)", {"queue": True}),
    ("lock_many (2 of 3 names)", {}),
    (f"semaphore (limit {SEMAPHORE_LIMIT})", {}),
    ("election (campaign, ~1 ms terms)", {}),
]
PRIMITIVE_FAULTS: list[tuple[str, Fault, dict[str, Any]]] = [
    ("minority paused", pause_minority, {}),
    ("minority restarted, data lost", _restarts(False), {"restart_quarantine": QUARANTINE}),
    ("minority black-holed", _proxy_fault("blackhole", 2, 0.4, 0.1), {}),
]


def _kind(label: str) -> str:
    return {"grant": "lock", "lock_many": "lock_many", "semaphore": "semaphore", "election": "election"}[
        label.split(" ")[0]
    ]


def render(outcomes: list[Outcome], seconds: float, clocks: list[ClockOutcome] | None = None) -> str:
    lines = [
        "# Safety report",
        "",
        "Mutual exclusion under faults, on 5 real valkey-server nodes behind loopback proxies.",
        f"Made by `python benchmarks/safety.py --seconds {seconds:g}` at commit {library_commit()}, "
        f"{datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        f"Each contention scenario: {CLIENTS} Redlock clients x {TASKS} tasks, one fenced lock (ttl {TTL:g} s),",
        f"~1 ms critical sections, {seconds:g} s under the fault. Every section is recorded; the checker",
        "counts overlapping sections between different holders and fencing tokens that went backwards.",
        "Then, with the faults healed and two ttls later, no lease, permit or line may be left on any node.",
        "",
        "The rows named after a primitive run the same contention through it instead of one lock: the grant",
        "queue (`queue=True`, fenced); `lock_many` of two of three names, so any two acquisitions share a",
        f"name (each name checked on its own); a semaphore of limit {SEMAPHORE_LIMIT} (an *overlap* there is a moment",
        f"with more than {SEMAPHORE_LIMIT} permits held, fencing tokens are not checked); an election, each",
        "leader resigning after ~1 ms (its term checked as a fencing token).",
        "",
        "| scenario | expected | acquisitions tried | granted | overlaps | fencing regressions | keys left | result |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for o in outcomes:
        verdict = "pass" if o.passed else "**FAIL**"
        lines.append(
            f"| {o.name} | {o.expect} | {o.attempts} | {o.granted} | {o.overlaps} | {o.regressions} "
            f"| {o.leftover} | {verdict} |"
        )
    lines += [
        "",
        "*expected*: **safe** = zero overlaps and regressions, locks keep being granted, no key left;",
        "**no grants** = a majority is out, so nothing may be granted (each acquire gives up after its",
        "0.5 s timeout with LockNotAcquired); **hazard** = the restart quarantine is turned off",
        "(`restart_quarantine=0`) and the checker must find the overlap the Redlock analysis predicts:",
        "A holds nodes 0, 1, 2, node 2 restarts without its data, B gets 2, 3, 4. With the quarantine",
        "on (the default), node 2 sits out every quorum until A's lease is over, and B is refused.",
        "",
        "Not in the table, because it is about the client rather than the nodes: a client process",
        "paused (SIGSTOP) longer than its validity. A lease alone cannot protect the resource then;",
        "`tests/test_client_pause.py` shows the overlap, the `LockLost` the paused client gets on",
        "resume, and the fencing token that lets the resource refuse its late write.",
        "",
        "Faults applied, per scenario:",
        "",
    ]
    for o in outcomes:
        shown = ", ".join(o.faults[:8]) + (f", ... ({len(o.faults)} in all)" if len(o.faults) > 8 else "")
        lines.append(f"- {o.name}: {shown or 'none'} ({o.seconds:.1f} s)")
    lines += render_clock(clocks or [])
    return "\n".join(lines) + "\n"


async def run(seconds: float, only: str | None) -> list[Outcome]:
    outcomes = []
    for n, (name, expect, fault, settings) in enumerate(SCENARIOS):
        if only and only not in name:
            continue
        print(f"-- {name}", file=sys.stderr, flush=True)
        outcomes.append(await contend(name, expect, fault, seconds, seed=n, **settings))
    for label, extra in PRIMITIVES:
        for fault_name, fault, settings in PRIMITIVE_FAULTS:
            name = f"{label}: {fault_name}"
            if only and only not in name:
                continue
            print(f"-- {name}", file=sys.stderr, flush=True)
            seed = len(outcomes)
            outcomes.append(
                await contend(name, "safe", fault, seconds, seed, primitive=_kind(label), **extra, **settings)
            )
    if not only or "processes" in only:
        print("-- several OS processes", file=sys.stderr, flush=True)
        outcomes.append(await processes(4, seconds * 2))
    if not only or "analysis" in only:
        for quarantine in (0.0, None):
            print("-- analysis sequence", file=sys.stderr, flush=True)
            outcomes.append(await analysis_sequence(quarantine, rounds=3))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time under each fault (default 5)")
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    parser.add_argument("--print", action="store_true", help="print the report instead of writing docs/safety.md")
    args = parser.parse_args()
    outcomes = asyncio.run(run(args.seconds, args.only))
    clocks: list[ClockOutcome] = []
    if not args.only or "clock" in args.only:
        if why := unavailable():
            print(f"-- clock faults NOT RUN: {why}", file=sys.stderr, flush=True)
        else:
            print("-- clock faults", file=sys.stderr, flush=True)
            clocks = asyncio.run(clock_matrix())
    report = render(outcomes, args.seconds, clocks)
    if args.print or args.only:
        print(report)
    else:
        path = Path(ROOT, "docs", "safety.md")
        path.write_text(report)
        print(f"wrote {path}", file=sys.stderr)
    guarded_overlaps = [c for c in clocks if c.overlap > 0 and c.library.startswith("redlock_async, clock guard on")]
    return 0 if all(o.passed for o in outcomes) and not guarded_overlaps else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
