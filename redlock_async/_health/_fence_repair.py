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

The same holds of a Cluster voter's shard whose primary changed (a promoted replica may lack increments
its old primary took; ``_shards.py`` keeps it out meanwhile): its counters, those of the slots it serves,
are raised from the other voters before it counts again. The sources are voters of every kind: a
standalone node is read whole, a Cluster voter through each shard primary that serves the slots repaired
(``SCAN`` there, then ``MGET`` per slot), and such a voter counts as kept its data only if each of those
shards did (:func:`voter_judged`). A standalone node's repair reads the Cluster voters the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from redlock_async._core import quorum
from redlock_async._nodes import ClusterVoter, Failure, Node, Reply, key_slot
from redlock_async._scripts import FENCED_BY, RAISE_COUNTER

log = logging.getLogger("redlock_async._quarantine")  # said of the quarantine's nodes, as its other words

K = TypeVar("K", bound=Hashable)

Repair = Callable[[int], Awaitable[str | None]]
"""Raises the fencing counters of the quarantine's node *i* from the other voters (:meth:`CounterRepair.node`,
bound to the voter it is): None when done, else why not."""

Slots = frozenset[int] | None
"""The cluster slots whose counters a repair raises: a shard's; None for a standalone node (every slot)."""

Counters = dict[bytes, tuple[int, int]]
"""Fencing counters read on a voter: key -> (value, ttl in ms, 0 when none)."""

REPAIR_RETRY = 0.5
"""Seconds before the fencing counters of a node back from a restart are copied again, when the other nodes
could not be read."""

SCAN_COUNT = 5000
"""Keys a SCAN step looks at (the server's work per step; a node of a million keys takes 200 steps)."""

CHUNK = 1000
"""Counters read (MGET, PTTL) or raised per write."""


FEW_SOURCES = (
    "too few other voters kept their data to raise its fencing counters from a majority (a majority restarted or"
    " failed over at once?): raised from the connected others as they are"
)


def repair_sources(
    i: int, seen: Sequence[bool], behind: Sequence[bool], connected: Sequence[bool]
) -> tuple[list[int], int, bool]:
    """The voters to read voter *i*'s counters from (or its shard's), how many of them must answer, and whether
    that is a majority of voters that kept their data: the others seen whose counters are whole (not *behind*),
    a majority of all voters. If not even every voter not judged yet could make that majority (a majority
    restarted at once: nothing keeps every token then), every other connected voter, as many as answer, so
    that the deployment comes back at all (and False: the caller warns). A Cluster voter is judged here by its
    shards that serve the slots repaired (:func:`voter_judged`)."""
    need = quorum(len(seen))
    others = [j for j in range(len(seen)) if j != i]
    whole = [j for j in others if seen[j] and not behind[j] and connected[j]]
    maybe = [j for j in others if not seen[j] or not connected[j]]
    if len(whole) + len(maybe) >= need:
        return whole, need, True
    return [j for j in others if connected[j]], 0, False


def serving(owners: Sequence[Node | None], slots: Slots) -> list[Node]:
    """The primaries of a Cluster voter's slot map (*owners*, per slot) that serve any of *slots* (None: any)."""
    chosen: Iterable[int] = range(len(owners)) if slots is None else slots
    return list(dict.fromkeys(owner for slot in chosen if (owner := owners[slot]) is not None))


def voter_judged(shards: Sequence[tuple[bool, bool, bool]]) -> tuple[bool, bool, bool]:
    """A Cluster voter as a source of counters, from its (seen, behind, connected) shards that serve the slots
    repaired: seen and connected if every one is (and there is one: its map was read), behind if any is (a
    shard that lost its counters and is not raised yet: the voter's counters of its slots may be low)."""
    return (
        bool(shards) and all(seen for seen, _, _ in shards),
        any(behind for _, behind, _ in shards),
        bool(shards) and all(connected for _, _, connected in shards),
    )


def _unjudged(_: int) -> tuple[bool, bool]:
    return True, False


def _unjudged_shard(_: int, __: Node) -> tuple[bool, bool]:
    return True, False


class CounterRepair:
    """The fencing counters' repair of one Redlock's voters (standalone, Sentinel and Cluster alike): which
    voters a node's or a shard's counters are read from, by the majority rule (:func:`repair_sources`), read
    (on a Cluster voter, each shard primary that serves the slots repaired), and raised on it, raise only."""

    def __init__(self, nodes: Sequence[Node], *, prefix: bytes, timeout: float) -> None:
        self._nodes = tuple(nodes)
        self._prefix = prefix
        self._timeout = timeout
        self.node_judged: Callable[[int], tuple[bool, bool]] = _unjudged
        """Standalone (or Sentinel) voter *j*: (seen, behind), as its restart quarantine judged it."""
        self.shard_judged: Callable[[int, Node], tuple[bool, bool]] = _unjudged_shard
        """A shard primary of Cluster voter *j*: (seen, behind), as the shard quarantine judged it."""

    def judged(self, slots: Slots) -> tuple[list[bool], list[bool], list[bool]]:
        """Per voter: seen, behind, connected, for the counters of *slots*."""
        seen: list[bool] = []
        behind: list[bool] = []
        connected: list[bool] = []
        for j, node in enumerate(self._nodes):
            if isinstance(node, ClusterVoter):
                shards = [(*self.shard_judged(j, shard), shard.connected) for shard in serving(node.owners, slots)]
                one = voter_judged(shards)
            else:
                one = (*self.node_judged(j), node.connected)
            seen.append(one[0])
            behind.append(one[1])
            connected.append(one[2])
        return seen, behind, connected

    async def node(self, i: int) -> str | None:
        """Raise standalone voter *i*'s counters from the others: None when done, else why not."""
        return await self._raise(i, self._nodes[i], None)

    async def shard(self, i: int, shard: Node) -> str | None:
        """Raise the counters of the slots *shard* serves (a primary of Cluster voter *i*) from the other voters."""
        voter = self._nodes[i]
        assert isinstance(voter, ClusterVoter)
        slots = frozenset(slot for slot, owner in enumerate(voter.owners) if owner is shard)
        if not slots:
            # Not done: a map read from a node that has not seen the failover yet may name the old primary a
            # moment; called done, this shard would be marked in service with its counters low, and count at once
            # when the map names it again. Tried again until the map names it (its voter reads the map every few
            # seconds) or its next connection is judged again (a primary that serves again is dropped first).
            return "it serves no slot in its voter's slot map"
        return await self._raise(i, shard, slots)

    async def _raise(self, i: int, target: Node, slots: Slots) -> str | None:
        seen, behind, connected = self.judged(slots)
        for j, up in enumerate(connected):
            if j != i and not up:
                self._wake(self._nodes[j], slots)
        sources, need, whole = repair_sources(i, seen, behind, connected)
        if not whole:
            log.warning("redlock node %s: %s", target.name, FEW_SOURCES)
        if len(sources) < need:
            kept = len(sources)
            return f"only {kept} other voters that kept their data to read its fencing counters from, {need} needed"
        read = await asyncio.gather(*(self._read(self._nodes[j], slots) for j in sources), return_exceptions=True)
        counters = [one for one in read if isinstance(one, dict)]
        if len(counters) < need:
            failed = next((one for one in read if isinstance(one, BaseException)), None)
            return f"only {len(counters)} other voters could be read, {need} needed ({failed})"
        return await raise_to(target, largest(counters), self._timeout)

    def _wake(self, node: Node, slots: Slots) -> None:
        """Connect a voter not connected (on a Cluster voter, each shard serving *slots*; its map read first):
        a connection is made on use, and a repair may wait for that voter's word (its probe says whether it
        kept its data), while nothing else uses it (no lock of a name of those slots taken meanwhile)."""
        if not isinstance(node, ClusterVoter):
            node.send(b"PING")
            return
        shards = serving(node.owners, slots)
        if not shards:
            node.refresh_soon()
        for shard in shards:
            if not shard.connected:
                shard.send(b"PING")

    async def _read(self, node: Node, slots: Slots) -> Counters:
        """Every fencing counter of *slots* on voter *node*: on a Cluster voter, of each primary serving them."""
        if not isinstance(node, ClusterVoter):
            return await _counters(node, self._prefix, self._timeout, slots)
        shards = serving(node.owners, slots)
        if not shards:
            raise _Unread(f"{node.name}: its slot map is not read")
        found: Counters = {}
        for one in await asyncio.gather(*(_counters(s, self._prefix, self._timeout, slots, True) for s in shards)):
            found.update(one)  # (each key on one shard: the one serving its slot)
        return found


def largest(counters: Iterable[Counters]) -> Counters:
    """For each counter, the largest value read, with its life: none if a voter keeps it for ever, else the longest."""
    best: Counters = {}
    for one in counters:
        for key, (value, ttl) in one.items():
            old = best.get(key)
            if old is None or value > old[0] or (value == old[0] and old[1] and (not ttl or ttl > old[1])):
                best[key] = (value, ttl)
    return best


async def raise_to(node: Node, best: Counters, timeout: float) -> str | None:
    """Raise each counter of *best* on *node* to its value, with its ttl (``RAISE_COUNTER``: raise only).
    None when done; else why not. *timeout*: one round trip's."""
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


class Repairs(Generic[K]):
    """The copies under way, one task per node (for a quarantine; a node is what *key* names: a standalone
    node's index, or a Cluster voter's shard): started when a quarantine that may have left a node's counters
    behind is over; the node counts again (*done*) only once the copy is done, tried again every REPAIR_RETRY
    until then. A new connection's probe cancels it (it judges the node again)."""

    def __init__(
        self,
        repair: Callable[[K], Awaitable[str | None]],
        node_of: Callable[[K], Node],
        done: Callable[[K], None],
        quiet: bool,
    ) -> None:
        self._repair = repair
        self._node_of = node_of
        self._done = done
        self._info = logging.DEBUG if quiet else logging.INFO
        self._tasks: dict[K, asyncio.Task[None]] = {}

    def running(self, key: K) -> bool:
        return key in self._tasks

    def start(self, key: K) -> None:
        """Copy the counters of the node *key* names."""
        if key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key))

    def cancel(self, key: K) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for key in list(self._tasks):
            self.cancel(key)

    async def _run(self, key: K) -> None:
        node = self._node_of(key)
        said = None
        while True:
            try:
                why = await self._repair(key)
            except Exception as exc:  # a bug here must not leave the node out for ever, unsaid
                why = f"{type(exc).__name__}: {exc}"
            if self._tasks.get(key) is not asyncio.current_task():
                return  # cancelled meanwhile: a new connection's probe judges it again
            if why is None:
                del self._tasks[key]
                self._done(key)
                return
            if why != said:  # (said once while the reason stays)
                log.log(self._info, "redlock node %s sits out a moment more: %s", node.name, why)
                said = why
            node.quarantine_reason = f"back from a restart, its fencing counters not raised yet: {why}"
            await asyncio.sleep(REPAIR_RETRY)


class _Unread(Exception):
    """A node could not be read (or written) in time: the copy is tried again later."""


async def _counters(node: Node, prefix: bytes, timeout: float, slots: Slots, per_slot: bool = False) -> Counters:
    """Every fencing counter of *slots* (None: all) on *node*. *per_slot*: a cluster node, whose MGET takes
    the keys of one slot only."""
    pattern = _glob_escape(prefix) + b"*"
    keys: list[bytes] = []
    cursor: Reply = b"0"
    while True:
        (reply,) = await _replies([node.send(b"SCAN", cursor, b"MATCH", pattern, b"COUNT", SCAN_COUNT)], timeout)
        if not isinstance(reply, list) or len(reply) != 2 or not isinstance(reply[1], list):
            raise _Unread(f"{node.name}: SCAN answered {reply!r:.80}")
        cursor = reply[0]
        keys += [
            key
            for key in reply[1]
            if isinstance(key, bytes) and not key.endswith(FENCED_BY) and (slots is None or key_slot(key) in slots)
        ]
        if cursor in (b"0", 0):
            break
    found: Counters = {}
    for chunk in chunks(keys, per_slot):
        values, *ttls = await _replies(
            [node.send(b"MGET", *chunk), *(node.send(b"PTTL", key) for key in chunk)], timeout
        )
        if not isinstance(values, list):
            raise _Unread(f"{node.name}: MGET answered {values!r:.80}")
        for key, value, ttl in zip(chunk, values, ttls, strict=True):
            if isinstance(value, bytes) and value.isdigit() and isinstance(ttl, int) and ttl != -2:
                found[key] = (int(value), max(ttl, 0))
    return found


def chunks(keys: list[bytes], per_slot: bool) -> list[list[bytes]]:
    """*keys* in chunks of at most CHUNK; with *per_slot*, each chunk's keys of one slot."""
    if not per_slot:
        return [keys[start : start + CHUNK] for start in range(0, len(keys), CHUNK)]
    by_slot: dict[int, list[bytes]] = {}
    for key in keys:
        by_slot.setdefault(key_slot(key), []).append(key)
    return [same[start : start + CHUNK] for same in by_slot.values() for start in range(0, len(same), CHUNK)]


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
