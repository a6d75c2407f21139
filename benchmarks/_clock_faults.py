"""The clock section of the safety report: nodes whose clocks jump or race under a held lock.

For each library (redlock_async with its clock guard on and off, aioredlock, pottery), each fault
(1, 2, 3 or 5 of 5 nodes stepping +60 s, or running x4) on fresh nodes with libfaketime
(``LocalNodes(5, clock=True)``): a holder takes the lock (a 10 s lease, each library's own
acquire, no extension), a second client that talked to every node before the fault (a warm-up
acquire of another name) then tries the lock every 20 ms for a while. An *overlap* is a grant to
the second client while the holder's lease, by the holder's own reckoning (granted at + 10 s less
the 1 % drift allowance), still runs; the row says how long the two overlapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _peers import LEASE_S, Aioredlock, Handle, Peer, Pottery

from redlock_async import Lock, Redlock
from redlock_async.testing import LocalNodes, faketime_library

FAULTS: tuple[tuple[str, int], ...] = tuple(
    (fault, count) for fault in ("step +60 s", "run x4") for count in (1, 2, 3, 5)
)
TRY_FOR = {"step +60 s": 1.0, "run x4": 3.5}  # x4 expires a 10 s lease in 2.5 s
"""Seconds the second client keeps trying after the fault."""
DRIFT = 0.01
NEMESIS_SLOW = "RuntimeError: the node's clock did not take the change"


@dataclass
class ClockOutcome:
    library: str
    fault: str
    count: int
    granted_to_second: bool = False
    overlap: float = 0.0
    """Seconds both believed they held the lock (0: none)."""
    error: str = ""


class _OurHandle:
    """redlock_async's lock in the shape of the peers' handles (one attempt, release), no watchdog."""

    def __init__(self, lock: Lock) -> None:
        self.lock = lock

    async def try_acquire(self) -> bool:
        return await self.lock.acquire(blocking=False)

    async def release(self) -> None:
        await self.lock.release()


class _Ours:
    def __init__(self, urls: Sequence[str], guard: bool) -> None:
        self.redlock = Redlock(urls, ttl=LEASE_S, clock_guard=guard)

    async def open(self) -> None:
        await self.redlock.connect()

    def handle(self, resource: str) -> _OurHandle:
        return _OurHandle(self.redlock.lock(f"cmp:{resource}", auto_extend=False))

    async def aclose(self) -> None:
        await self.redlock.aclose()


LIBRARIES: tuple[tuple[str, Any], ...] = (
    ("redlock_async, clock guard on (default)", lambda urls: _Ours(urls, True)),
    ("redlock_async, `clock_guard=False`", lambda urls: _Ours(urls, False)),
    ("aioredlock", Aioredlock),
    ("pottery", Pottery),
)


def unavailable() -> str | None:
    return None if faketime_library() is not None else "no libfaketime here (apt-get install faketime)"


async def _one(library: str, make: Any, fault: str, count: int) -> ClockOutcome:
    outcome = ClockOutcome(library, fault, count)
    if isinstance(make, type) and issubclass(make, Peer) and (why := make.unavailable()):
        outcome.error = why
        return outcome
    with LocalNodes(5, clock=True) as nodes:
        first, second = make(nodes.urls), make(nodes.urls)
        await first.open()
        await second.open()
        try:
            warm: Handle = second.handle("clock:warm")  # the second client talks to every node before the fault
            if await warm.try_acquire():
                await warm.release()
            held: Handle = first.handle("clock")
            granted_at = time.monotonic()
            if not await held.try_acquire():
                outcome.error = "the holder could not take the lock"
                return outcome
            believed_until = granted_at + LEASE_S * (1 - DRIFT)
            for node in list(nodes)[:count]:
                if fault.startswith("step"):
                    await asyncio.to_thread(node.clock.step, 60.0)
                else:
                    await asyncio.to_thread(node.clock.run_at, 4.0)
            other = second.handle("clock")
            stop = time.monotonic() + TRY_FOR[fault]
            while time.monotonic() < stop:
                if await other.try_acquire():
                    at = time.monotonic()
                    outcome.granted_to_second = True
                    outcome.overlap = max(0.0, believed_until - at)
                    with contextlib.suppress(Exception):  # (pottery raises when the key went meanwhile)
                        await other.release()
                    break
                await asyncio.sleep(0.02)
            with contextlib.suppress(Exception):  # a holder that lost its keys may say so here: not a failure
                await held.release()
        except Exception as exc:  # a peer's own failure is a row, not a crash of the report
            outcome.error = f"{type(exc).__name__}: {exc}"[:120]
        finally:
            await first.aclose()
            await second.aclose()
    return outcome


async def clock_matrix() -> list[ClockOutcome]:
    outcomes = []
    for library, make in LIBRARIES:
        for fault, count in FAULTS:
            print(f"-- clock: {library}, {count} of 5 {fault}", file=sys.stderr, flush=True)
            outcome = await _one(library, make, fault, count)
            if outcome.error.startswith(NEMESIS_SLOW):  # the machine too loaded for the nemesis to settle: again
                outcome = await _one(library, make, fault, count)
            outcomes.append(outcome)
    return outcomes


def render_clock(outcomes: list[ClockOutcome]) -> list[str]:
    if not outcomes:
        return []
    faults = list(dict.fromkeys((o.fault, o.count) for o in outcomes))
    lines = [
        "",
        "## Clock faults",
        "",
        "Nodes whose wall clocks jump or race (libfaketime on the servers: `LocalNodes(5, clock=True)`),",
        f"while one client holds a lock (a {LEASE_S:g} s lease, no extension) and a second client that talked",
        "to every node before the fault tries it every 20 ms (1 s after a step, 3.5 s after a rate change).",
        "A cell shows *overlap* and for how long both believed they held the lock (the holder's lease by its",
        "own reckoning: granted + ttl less 1 % drift), or *refused* when the second client got nothing.",
        "Made by `python benchmarks/safety.py --only clock`.",
        "",
        "| library | " + " | ".join(f"{count} of 5 {fault}" for fault, count in faults) + " |",
        "| --- |" + " --- |" * len(faults),
    ]
    for library in dict.fromkeys(o.library for o in outcomes):
        cells = []
        for fault, count in faults:
            o = next(x for x in outcomes if x.library == library and x.fault == fault and x.count == count)
            if o.error:
                cells.append(f"n/a ({o.error})")
            elif o.granted_to_second and o.overlap > 0:
                cells.append(f"**overlap {o.overlap:.1f} s**")
            elif o.granted_to_second:
                cells.append("granted after the lease")
            else:
                cells.append("refused")
        lines.append(f"| {library} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "With 1 or 2 of 5 nodes faulted the sound nodes still hold a majority: no library overlaps. With",
        "3 or 5, the jumped nodes expired the holder's key: a library that counts their votes grants the",
        "lock again. redlock_async's clock guard reads each node's `TIME` in the same write as every vote",
        "and refuses the votes of a node whose clock advanced more than the drift allows since its last",
        "exchange with it. A client with no earlier exchange (a fresh one) cannot see a jump from before",
        'it started: fencing covers that case (docs/algorithm.md, "Clock faults").',
    ]
    return lines
