"""A node back from a restart gets its fencing counters back before it counts again (docs/fencing.md,
"A node that lost its counters").

A fencing token is one more than the largest counter on the nodes that granted, and a grant counts only
once a majority raised its counter to it: a later grant meets one of those nodes and reads at least that.
A node that restarted empty (or from an old snapshot) lost its counters; once its restart quarantine is
over it would count again with a counter below what it had, and two such nodes of one grant's majority,
restarted one after the other, leave fewer than a majority with that grant's token: a later grant can
then read only lower counters (8, then 6). So before it counts again, every counter of the other nodes
is copied onto it, raised only (``RAISE_COUNTER``): for each counter, the largest value read on a
majority of the nodes that kept their data (the quarantine says which nodes those are). Every earlier
grant's token is on at least one of them (see the docs), so the restarted node is back to at least
every token given, and the majorities are whole again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from redlock_async._core import quorum
from redlock_async._nodes import Failure, Node, Reply
from redlock_async._scripts import FENCED_BY, RAISE_COUNTER

log = logging.getLogger("redlock_async._quarantine")  # said of the quarantine's nodes, as its other words

Repair = Callable[[int, list[int], int], Awaitable[str | None]]
"""Raises node *i*'s fencing counters from the nodes listed, at least as many as the number given answering
(:func:`raise_counters`, bound to the nodes): None when done, else why not."""

REPAIR_RETRY = 0.5
"""Seconds before the fencing counters of a node back from a restart are copied again, when the other nodes
could not be read."""

SCAN_COUNT = 5000
"""Keys a SCAN step looks at (the server's work per step; a node of a million keys takes 200 steps)."""

CHUNK = 1000
"""Counters read (MGET, PTTL) or raised per write."""


FEW_SOURCES = (
    "too few other nodes kept their data to raise its fencing counters from a majority (a majority restarted at"
    " once?): raised from the connected others as they are"
)


def repair_sources(
    i: int, seen: Sequence[bool], behind: Sequence[bool], connected: Sequence[bool]
) -> tuple[list[int], int, bool]:
    """The nodes to read node *i*'s counters from, how many of them must answer, and whether that is a
    majority of nodes that kept their data: the others seen whose counters are whole (not *behind*), a
    majority of them. If not even every node not judged yet could make that majority (a majority restarted
    at once: nothing keeps every token then), every other connected node, as many as answer, so that the
    cluster comes back at all (and False: the caller warns)."""
    need = quorum(len(seen))
    others = [j for j in range(len(seen)) if j != i]
    whole = [j for j in others if seen[j] and not behind[j] and connected[j]]
    maybe = [j for j in others if not seen[j] or not connected[j]]
    if len(whole) + len(maybe) >= need:
        return whole, need, True
    return [j for j in others if connected[j]], 0, False


class Repairs:
    """The copies under way, one task per node (for a Quarantine): started when a quarantine that may have
    left a node's counters behind is over; the node counts again (*done*) only once the copy is done, tried
    again every REPAIR_RETRY until then. A new connection's probe cancels it (it judges the node again)."""

    def __init__(self, nodes: Sequence[Node], repair: Repair, done: Callable[[int], None], quiet: bool) -> None:
        self._nodes = nodes
        self._repair = repair
        self._done = done
        self._info, self._warning = (logging.DEBUG, logging.DEBUG) if quiet else (logging.INFO, logging.WARNING)
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def running(self, i: int) -> bool:
        return i in self._tasks

    def start(self, i: int, judged: Callable[[], tuple[Sequence[bool], Sequence[bool]]]) -> None:
        """Copy node *i*'s counters; *judged* gives, at each try, which nodes were seen and which are behind."""
        if i not in self._tasks:
            self._tasks[i] = asyncio.get_running_loop().create_task(self._run(i, judged))

    def cancel(self, i: int) -> None:
        task = self._tasks.pop(i, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for i in list(self._tasks):
            self.cancel(i)

    async def _run(self, i: int, judged: Callable[[], tuple[Sequence[bool], Sequence[bool]]]) -> None:
        node = self._nodes[i]
        while True:
            seen, behind = judged()
            sources, need, whole = repair_sources(i, seen, behind, [other.connected for other in self._nodes])
            if not whole:
                log.log(self._warning, "redlock node %s: %s", node.name, FEW_SOURCES)
            try:
                why = await self._repair(i, sources, need)
            except Exception as exc:  # a bug here must not leave the node out for ever, unsaid
                why = f"{type(exc).__name__}: {exc}"
            if self._tasks.get(i) is not asyncio.current_task():
                return  # cancelled meanwhile: a new connection's probe judges it again
            if why is None:
                del self._tasks[i]
                self._done(i)
                return
            log.log(self._info, "redlock node %s sits out a moment more: %s", node.name, why)
            node.quarantine_reason = f"back from a restart, its fencing counters not raised yet: {why}"
            await asyncio.sleep(REPAIR_RETRY)


class _Unread(Exception):
    """A node could not be read (or written) in time: the copy is tried again later."""


async def raise_counters(
    nodes: Sequence[Node], i: int, sources: Sequence[int], need: int, *, prefix: bytes, timeout: float
) -> str | None:
    """Raise every fencing counter (keys under *prefix*) on ``nodes[i]`` to the largest value read for it
    on the nodes *sources* (at least *need* of them must answer: a majority of nodes that kept their data),
    with its ttl. None when done; else why not (the caller tries again later; the node keeps sitting out
    meanwhile). *timeout*: one round trip's."""
    if len(sources) < need:
        return f"only {len(sources)} other nodes that kept their data to read its fencing counters from, {need} needed"
    others = [nodes[j] for j in sources]
    read = await asyncio.gather(*(_counters(node, prefix, timeout) for node in others), return_exceptions=True)
    counters = [one for one in read if isinstance(one, dict)]
    if len(counters) < need:
        failed = next((one for one in read if isinstance(one, BaseException)), None)
        return f"only {len(counters)} other nodes could be read, {need} needed ({failed})"
    best: dict[bytes, tuple[int, int]] = {}  # counter key -> (largest value, its ttl in ms; 0: none)
    for one in counters:
        for key, (value, ttl) in one.items():
            old = best.get(key)
            if old is None or value > old[0] or (value == old[0] and old[1] and (not ttl or ttl > old[1])):
                best[key] = (value, ttl)
    node = nodes[i]
    items = list(best.items())
    try:
        for start in range(0, len(items), CHUNK):
            writes = [
                node.send_script(RAISE_COUNTER, (key,), (value, ttl))
                for key, (value, ttl) in items[start : start + CHUNK]
            ]
            for reply in await _replies(writes, timeout * 2):
                if isinstance(reply, Failure):
                    return f"its fencing counters could not be raised: {reply.detail or reply.vote.value}"
    except _Unread as exc:
        return f"its fencing counters could not be raised: {exc}"
    return None


async def _counters(node: Node, prefix: bytes, timeout: float) -> dict[bytes, tuple[int, int]]:
    """Every fencing counter on *node*: key -> (value, ttl in ms, 0 when none)."""
    pattern = _glob_escape(prefix) + b"*"
    keys: list[bytes] = []
    cursor: Reply = b"0"
    while True:
        (reply,) = await _replies([node.send(b"SCAN", cursor, b"MATCH", pattern, b"COUNT", SCAN_COUNT)], timeout)
        if not isinstance(reply, list) or len(reply) != 2 or not isinstance(reply[1], list):
            raise _Unread(f"{node.name}: SCAN answered {reply!r:.80}")
        cursor = reply[0]
        keys += [key for key in reply[1] if isinstance(key, bytes) and not key.endswith(FENCED_BY)]
        if cursor in (b"0", 0):
            break
    found: dict[bytes, tuple[int, int]] = {}
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        values, *ttls = await _replies(
            [node.send(b"MGET", *chunk), *(node.send(b"PTTL", key) for key in chunk)], timeout
        )
        if not isinstance(values, list):
            raise _Unread(f"{node.name}: MGET answered {values!r:.80}")
        for key, value, ttl in zip(chunk, values, ttls, strict=True):
            if isinstance(value, bytes) and value.isdigit() and isinstance(ttl, int) and ttl != -2:
                found[key] = (int(value), max(ttl, 0))
    return found


async def _replies(futures: list[asyncio.Future[Reply]], timeout: float) -> list[Reply]:
    """The replies, once all are in (a Failure raises :class:`_Unread`); :class:`_Unread` after *timeout*."""
    done, _ = await asyncio.wait(futures, timeout=timeout)
    if len(done) < len(futures):
        for future in futures:
            future.cancel()  # an abandoned reply is discarded; the connection stays sound
        raise _Unread(f"no answer within {timeout:g} s")
    replies = [future.result() for future in futures]
    for reply in replies:
        if isinstance(reply, Failure):
            raise _Unread(reply.detail or reply.vote.value)
    return replies


def _glob_escape(prefix: bytes) -> bytes:
    """*prefix* as a SCAN MATCH pattern that matches it literally."""
    for special in (b"\\", b"*", b"?", b"[", b"]"):
        prefix = prefix.replace(special, b"\\" + special)
    return prefix
