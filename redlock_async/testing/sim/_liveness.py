"""The liveness oracles: what a run must have done, not only what it must not, each judged only over
stretches the fault schedule (``_timeline``) shows healthy. docs/safety.md states each condition.

* ``free_try``: a ``blocking=False`` try refused while nobody else held or tried the lock (at most one
  other such try beside it, itself refused: two racers on five nodes cannot split the votes), with no
  fault since a ttl before either try until both ended.
* ``idle``: a lock wanted (some try waiting on it) and held by nobody for more than half a ttl, with no
  fault since a ttl before that stretch; a name of ``lock_many`` is not idle while the head of its line
  is a ``lock_many`` waiter still waiting for another of its names, held (FIFO per name, by design).
* ``overtaken``: while a try waited, with no fault since a ttl before, another client was granted the
  lock more than ``RUN`` times in a row by tries that began after it.
* ``lost_healthy``: a holder lost its lock though, from a ttl before its grant to the loss, at most one
  node was unhealthy for it (no fault reached its link to any other), and it had been extended twice
  with no fault reaching any other client from two ttls before its grant to its second extension (such
  a client's keys may stay on a node for a ttl): with the free nodes regained at each extension, four
  healthy nodes of five keep a lease. Judged without the grant queue only (a node that granted the key
  to a waiter in line keeps it for that waiter: docs/algorithm.md, "Regaining the free nodes").
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redlock_async.testing.sim._workloads import Attempt, Board

RUN = 40
"""Grants in a row to one other client that a waiting try may see (5 x the hand-over's chain of 8: a chain
ends by a release the other processes' waiters race for, and may lose, to a split vote or a late wake-up)."""

_SINGLE = ("lock", "fenced")  # one name, a mutex: who holds, who waits, who overtakes are plain
_MUTEX_LIKE = ("lock", "fenced", "many", "semaphore", "rw")  # nobody inside while wanted: idle
_REGAINING = ("lock", "fenced", "election")  # leases that regain free nodes


def check_liveness(board: Board) -> None:
    workload = board.config.workload
    for oracle in (
        _free_try if workload in _SINGLE else None,
        _idle if workload in _MUTEX_LIKE else None,
        _overtaken if workload in _SINGLE else None,
        _lost_healthy if workload in _REGAINING and board.settings.get("queue") is False else None,
    ):
        if oracle is not None:
            found = oracle(board)
            if found:
                board.violation(*found)


def _free_try(board: Board) -> tuple[str, str] | None:
    ttl = board.config.ttl
    for attempt in board.attempts:
        if attempt.blocking or attempt.outcome != "refused":
            continue
        if not board.timeline.quiet(attempt.start, attempt.finished, ttl):
            continue
        beside = [
            other
            for other in board.attempts
            if other is not attempt
            and set(other.resources) & set(attempt.resources)
            and other.start <= attempt.finished
            and (other.finished >= attempt.start - ttl / 4 or other.outcome == "running")
        ]
        if any(not board.timeline.quiet(other.start, other.finished, ttl) for other in beside):
            continue  # the other racer met a fault: a vote it held for a recheck may never be confirmed
        board.count("judged.free_try")
        if len(beside) <= 1 and all(not other.blocking and other.outcome == "refused" for other in beside):
            with_whom = f" beside {_shown(beside[0])}" if beside else ""
            return (
                "free_try",
                f"{_shown(attempt)} was refused{with_whom}: nobody else held or tried the lock, no fault",
            )
    return None


def _idle(board: Board) -> tuple[str, str] | None:
    ttl = board.config.ttl
    window = ttl / 2
    for resource, stretches in sorted(_idle_stretches(board).items()):
        for start, end in stretches:
            if not board.timeline.quiet(start, end, ttl):
                continue
            board.count("judged.idle")
            if end - start > window:
                return (
                    "idle",
                    f"{resource!r} was wanted and held by nobody from {start:.4f} to {end:.4f}, no fault",
                )
    return None


HEAD_SLACK = 0.05
"""Seconds (of a 1 s ttl) by which a try that began later may still have joined a line first: its first
round is answered a round trip after the other's, or before it."""


def _idle_stretches(board: Board) -> dict[str, list[tuple[float, float]]]:
    """Per resource, the stretches it was wanted (a blocking try waited on it) while nobody held it, nor was
    it reserved: a name whose line's head is a ``lock_many`` waiter still waiting for another of its names,
    held (or itself reserved so), waits for that name with it (FIFO per name, by design: docs/safety.md)."""
    ttl = board.config.ttl
    slack = HEAD_SLACK * ttl
    tries = [a for a in board.attempts if a.blocking]
    resources = sorted({name for a in tries for name in a.resources})
    held = {r: _union((s.start, s.end) for s in h.sections) for r in resources if (h := board.histories.get(r))}
    moments = {t for a in tries for t in (a.start, a.waited_until)}
    moments.update(t for intervals in held.values() for pair in intervals for t in pair)
    out: dict[str, list[tuple[float, float]]] = {}
    for start, end in itertools.pairwise(sorted(moments)):
        if end <= start:
            continue
        mid = (start + end) / 2
        waiting = [a for a in tries if a.start <= mid < a.waited_until]
        if not waiting:
            continue
        busy = {r for r in resources if _inside(held.get(r, ()), mid)}
        lines = {r: [a for a in waiting if r in a.resources] for r in resources}
        reserved = True
        while reserved:  # (a chain: a+b waits for a, reserved for a+c that waits for c, held)
            reserved = False
            for r, line in lines.items():
                if r in busy or not line:
                    continue
                first = min(a.start for a in line)
                heads = (a for a in line if len(a.resources) > 1 and a.start <= first + slack)
                if any(busy.intersection(a.resources) for a in heads):
                    busy.add(r)
                    reserved = True
        for r, line in lines.items():
            if line and r not in busy:
                stretches = out.setdefault(r, [])
                if stretches and stretches[-1][1] == start:
                    stretches[-1] = (stretches[-1][0], end)
                else:
                    stretches.append((start, end))
    return out


def _inside(intervals: object, moment: float) -> bool:
    return any(a <= moment < b for a, b in intervals)  # type: ignore[attr-defined]


def _overtaken(board: Board) -> tuple[str, str] | None:
    ttl = board.config.ttl
    for attempt in board.attempts:
        if not attempt.blocking:
            continue
        since, until = attempt.start, attempt.waited_until
        if until - since < ttl / 10 or not board.timeline.quiet(since, until, ttl):
            continue
        board.count("judged.overtaken")
        for resource in attempt.resources:
            run: list[str] = []
            for when, client, asked in board.grants.get(resource, []):
                if when <= since or when >= until:
                    continue
                if client == attempt.client or asked <= since or (run and run[-1] != client):
                    run = []
                if client != attempt.client and asked > since:
                    run.append(client)
                if len(run) > RUN:
                    return (
                        "overtaken",
                        f"{_shown(attempt)} waited while {client} was granted {resource!r} {len(run)} times "
                        f"in a row by later tries, no fault",
                    )
    return None


def _lost_healthy(board: Board) -> tuple[str, str] | None:
    ttl = board.config.ttl
    granted: dict[tuple[str, str], float] = {}
    extensions: dict[tuple[str, str], list[float]] = {}
    for kind, client, name, when in board.lock_events:
        key = (client, name)
        if kind == "acquired":
            granted[key] = when
            extensions[key] = []
        elif kind == "extended" and key in granted:
            extensions[key].append(when)
        elif kind == "lost" and key in granted:
            since = granted.pop(key)
            extended = extensions.pop(key)
            if len(extended) < 2 or board.timeline.others_reached(client, since, extended[1], 2 * ttl):
                continue
            unhealthy = board.timeline.unhealthy(client, since, when, ttl)
            if len(unhealthy) > 1:
                continue
            board.count("judged.lost_healthy")
            nodes = ", ".join(f"n{n}" for n in sorted(unhealthy)) or "none"
            return (
                "lost_healthy",
                f"{client} lost {name!r} at {when:.4f} (granted {since:.4f}, extended at "
                f"{', '.join(f'{x:.4f}' for x in extended)}) with one node at most unhealthy for it: {nodes}",
            )
    return None


def _union(intervals: object) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):  # type: ignore[call-overload]
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _shown(attempt: Attempt) -> str:
    kind = "try" if attempt.blocking else "blocking=False try"
    return f"{attempt.client}-{attempt.task}'s {kind} {attempt.start:.4f}-{attempt.finished:.4f}"
