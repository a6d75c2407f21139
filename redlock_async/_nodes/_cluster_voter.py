"""A Redis/Valkey Cluster as one voter (``redis+cluster://HOST:PORT[?seed=HOST:PORT...]``).

A :class:`ClusterVoter` is a node (:class:`_node.Node`) to every part above it: a ballot sends to it and
counts its reply as one vote. Behind that face it keeps one :class:`_node.Node` per shard primary (each
with its own connection, handshake and outbox, so a shard's commands stay in order on one connection)
and routes each command to the primary that owns the slot of its first key (``_slots.py``). It opens
no connection of its own: the slot map (``CLUSTER SHARDS``, or ``CLUSTER SLOTS`` on servers before 7.0)
is asked of a connected primary, or else of the seeds (``_cluster_map.py``); before it was ever read,
a command is not sent (its vote: skipped), so that no vote comes from a server the shard quarantine
has not judged.

The slot map is read at connect, then every :data:`REFRESH` seconds, and (in the background) after a
``MOVED`` and after a primary could not be reached. A primary that leaves the map, serves again after
serving nothing, or shows another replication id than when its connection began (demoted and promoted
back) has its connection dropped: the next one is judged before any vote of it counts. ``MOVED`` puts the slot's new
owner in the map at once and sends the command there; ``ASK`` sends it once to the node named, behind
``ASKING``; ``TRYAGAIN`` and ``CLUSTERDOWN`` count as the voter's timeout for that request (a failed or
migrating shard), as does a redirection beyond :data:`MAX_HOPS`. All of it happens inside the ballot's
deadline: a redirection is sent at once, no wait of its own.

A shard primary is judged as a standalone node is on each new connection: the voter's *shard_ready* hook
(the Redlock's shard quarantine, ``_health/_shards.py``) probes it first thing, and sets its
``quarantined_until``. A vote counts the quarantine of the shard that answered it: this voter's
:attr:`quarantined_until` is read by the ballot right as the reply is delivered, and says the answering
shard's (``_cluster_face.py``). Each primary's clock guard and eviction watch (``_health/_shard_health.py``,
through :attr:`shard_clock` and :attr:`shard_identified`) hold that primary out the same way. So a failed-over
shard sits out, and the names on the other shards keep voting. Scripts go as their ``SPUBLISH`` twins
(``_cluster_scripts.py``). No command adds work to a standalone node's path: the routing is this class's own
``send*`` methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from redlock_async._core import Vote
from redlock_async._core import clock as _clock
from redlock_async._nodes._cluster_face import ShardJudged
from redlock_async._nodes._cluster_map import MapError, ask_primaries, ask_seeds, replication_ids
from redlock_async._nodes._cluster_routing import Gather, Routed, drop, shard_endpoint
from redlock_async._nodes._cluster_scripts import (
    DELIFEQ,
    NATIVE_TWIN,
    PUBLISH,
    for_shard,
    scripted,
    sharded,
    sharded_publish,
)
from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._handshake import info_fields
from redlock_async._nodes._node import Node
from redlock_async._nodes._replicas import ReplicatedOutbox
from redlock_async._nodes._slots import (
    SLOTS,
    Address,
    Ranges,
    key_slot,
    routing_key,
    tag_for,
)
from redlock_async._nodes._wire import (
    IGNORED,
    Failure,
    Fallback,
    Reaction,
    Receiver,
    Reply,
    Resolve,
    pack,
    pack_script,
)
from redlock_async._scripts import Script

log = logging.getLogger("redlock_async._node")

ASKING = pack((b"ASKING",))

REFRESH = 5.0
"""Seconds after which the slot map is read again at the next command (it is also read after a ``MOVED``)."""


class ClusterVoter(ShardJudged):
    """One voter: a Redis Cluster whose shard primaries each vote for the names of their slots."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        shard_settings: dict[str, Any],
        scripts: tuple[Script, ...] = (),
        shard_ready: Callable[[Node], None] | None = None,
        shard_unreachable: Callable[[Node], None] | None = None,
        on_fault: Callable[[Node, BaseException], None] | None = None,
        probe_prefix: bytes = b"",
    ) -> None:
        self._held_until = 0.0
        self._held_reason = ""
        self._clock_until = 0.0
        self._eviction = ""
        self.answering: Node | None = None
        """The shard primary whose reply is being delivered (its quarantine is this voter's meanwhile), or
        the one :meth:`judged_by` named; None otherwise."""
        super().__init__(endpoint, on_fault=on_fault, warn=False, **shard_settings)
        self._settings = shard_settings
        self._ask_within = float(shard_settings.get("connect_timeout", 1.0)) * 2
        # SPUBLISH for PUBLISH (the map says), and the native release (where a primary's connection may run it).
        self._scripts_all = (*(sharded(script) for script in scripts), NATIVE_TWIN) if scripts else ()
        self._shard_ready = shard_ready
        self._probe_prefix = probe_prefix  # each primary's handshake asks of DELIFEQ on a key under it, in its slot
        self._shard_unreachable = shard_unreachable
        self._on_shard_fault = on_fault
        self.owners: list[Node | None] = [None] * SLOTS
        """Per slot, the primary that serves it as last read (None before the map is read)."""
        self.shards: dict[Address, Node] = {}
        """A node per primary address met (in the map or a redirection), kept while the voter lives."""
        self._first_slot: dict[Node, int] = {}
        self._serving: set[Node] = set()  # the primaries that serve a slot in the map
        self.newcomers: set[Node] = set()
        """Primaries first met serving slots another primary served before (a failover, a new owner)."""
        self._stale_at = 0.0
        self._refreshing: asyncio.Task[bool] | None = None
        self._keeping: asyncio.Task[None] | None = None
        self._replids: dict[Node, bytes] = {}  # each serving primary's replication id, as first read
        self.map_error = ""
        """Why the slot map could not be read, the last time it could not."""
        self._told_plain = False  # the user was told once that its ACL keeps the words on plain pub/sub
        self.refreshes = 0
        """How many times the slot map was read."""
        self.sharded = True
        """The hand-off words use sharded pub/sub: the map was read with ``CLUSTER SHARDS`` (servers 7.0+, which
        have ``SPUBLISH``); False after ``CLUSTER SLOTS`` answered instead (plain ``PUBLISH``, which every node
        carries)."""
        self.shard_identified: Callable[[Node], None] | None = None
        """Told of each shard primary's handshake (the Redlock's eviction watch of that shard)."""
        self.shard_clock: Callable[[Node], Receiver] | None = None
        """The receiver of a ``TIME`` read on a shard primary right before a vote (that shard's clock guard)."""
        self.map_read: list[Callable[[], None]] = []
        """Called after each reading of the slot map (the voter's subscriber moves the channels whose slot moved)."""
        self.send = self._send
        self.send_packed = self._send_packed
        self.send_timed = self._send_timed
        self.send_script = self._send_script
        self.cork = self._cork
        self.uncork = self._uncork

    def __repr__(self) -> str:
        return f"<ClusterVoter {self.name} shards={len(set(self.owners) - {None})}>"

    @property
    def connected(self) -> bool:
        return any(shard.connected for shard in self.shards.values())

    @property
    def unanswered(self) -> int:
        return sum(shard.unanswered for shard in self.shards.values()) + self.outbox.unanswered

    # -- routing ------------------------------------------------------------

    def shard_for(self, slot: int | None) -> Node | None:
        """The primary that serves *slot* as far as the map knows (any known primary for a command without key
        or a slot not mapped yet: a ``MOVED`` then says where); None before the map was ever read."""
        now = _clock.now()
        if now >= self._stale_at:
            self._stale_at = now + REFRESH
            self.refresh_soon()
        if slot is not None:
            owner = self.owners[slot]
            if owner is not None:
                return owner
        for shard in self.shards.values():
            if shard.connected:
                return shard
        return next(iter(self.shards.values()), None)

    def primaries(self) -> list[Node]:
        """The primaries that serve a slot in the map now."""
        return [owner for owner in dict.fromkeys(self.owners) if owner is not None]

    def slot_of(self, shard: Node) -> int | None:
        """The lowest slot *shard* serves in the map (its quarantine's marker key hashes there: every client
        that read the same map picks the same one), else the slot it was first met for."""
        try:
            return self.owners.index(shard)
        except ValueError:
            return self._first_slot.get(shard)

    def _route(
        self, receiver: Receiver, index: int, packed: bytes, limited: bool, fallback: Fallback, timed: bool = False
    ) -> None:
        if self.sharded and packed.startswith(PUBLISH):  # SPUBLISH for PUBLISH alone: routed to the channel's slot
            packed = sharded_publish(packed)
        key, digest = routing_key(packed)
        shard = self.shard_for(None if key is None else key_slot(key))
        if shard is None:
            # No vote without a primary judged by the shard quarantine: nothing is sent before the map is read.
            self.refresh_soon()
            why = self.map_error or "its slot map is not read yet"
            receiver.deliver(index, Failure(Vote.SKIPPED, f"Cluster voter: {why}"))
            return
        if digest:  # a script as this primary runs it: SPUBLISH for PUBLISH, DELIFEQ where its connection may
            packed, fallback = for_shard(packed, digest, fallback, self.sharded, shard.delifeq)
        routed = Routed(self, receiver, index, packed, limited, fallback, shard)
        if timed and self.shard_clock is not None:  # the shard's clock read right before its vote
            shard.send_timed(self.shard_clock(shard), routed, index, packed, limited=limited, fallback=fallback)
        else:
            shard.send_packed(routed, index, packed, limited=limited, fallback=fallback)

    def _send_packed(
        self, receiver: Receiver, index: int, packed: bytes, *, limited: bool = False, fallback: Fallback = None
    ) -> None:
        self._route(receiver, index, packed, limited, fallback)

    def _send_timed(
        self,
        clock: Receiver,
        receiver: Receiver,
        index: int,
        packed: bytes,
        *,
        limited: bool = False,
        fallback: Fallback = None,
    ) -> None:
        # Not the voter's clock guard (*clock*): its readings would compare several servers' clocks. Each shard
        # primary's own guard reads that primary's TIME (``_health/_shard_health.py``).
        self._route(receiver, index, packed, limited, fallback, timed=True)

    def _send(
        self, *args: bytes | str | int, limited: bool = False, fallback: Fallback = None
    ) -> asyncio.Future[Reply]:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if args[0] == b"MGET" and len({key_slot(key) for key in args[1:] if isinstance(key, bytes)}) > 1:
            # Keys of several slots (inspection's reads): read one by one, not atomically, and put together.
            gather = Gather(fut, len(args) - 1)
            for index, key in enumerate(args[1:]):
                self._route(gather, index, pack((b"GET", key)), limited, None)
            return fut
        self._route(Resolve(fut), 0, pack(args), limited, fallback)
        return fut

    def _send_script(
        self, script: Script, keys: tuple[bytes, ...], args: tuple[bytes | int, ...], *, limited: bool = False
    ) -> asyncio.Future[Reply]:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._route(Resolve(fut), 0, pack_script(script, keys, args), limited, (script, keys, args))
        return fut

    def _cork(self) -> None:
        for shard in self.shards.values():
            shard.cork()

    def _uncork(self) -> None:
        for shard in self.shards.values():
            shard.uncork()

    def redirected(self, routed: Routed, kind: str, slot: int, address: Address) -> None:
        """A shard answered ``MOVED`` or ``ASK``: send the command where it says (``ASK``: once, behind
        ``ASKING``; ``MOVED``: the slot is that node's from now on, and the map is read again soon)."""
        shard = self._shard(address, slot)
        if kind == "MOVED":
            self.owners[slot] = shard
            if shard not in self._serving:
                self._serving.add(shard)
                drop(shard)  # a node that served nothing (demoted, or new) is judged again before its votes
            self.refresh_soon()
        routed.shard = shard
        key, digest = routing_key(routed.packed)
        if digest:  # as the primary it lands on runs it (its DELIFEQ or not)
            sent = for_shard(routed.packed, digest, routed.fallback, self.sharded, shard.delifeq)
            routed.packed, routed.fallback = sent
        elif key is not None and not shard.delifeq and routed.packed.startswith(DELIFEQ):
            routed.packed, routed.fallback = scripted(routed.packed, key)
        if kind == "MOVED":
            shard.send_packed(routed, routed.index, routed.packed, limited=routed.limited, fallback=routed.fallback)
            return
        # ASKING and the command back to back, both or neither (neither limited: a stalled node refusing the
        # command alone would leave ASKING to the next command on the connection, for another slot). A vote
        # under wait_replicas still has its WAIT behind it, on the importing primary that took the write.
        shard.send_packed(IGNORED, 0, ASKING)
        outbox = shard.outbox
        if routed.limited and isinstance(outbox, ReplicatedOutbox):
            outbox.send_waited(routed, routed.index, routed.packed, fallback=routed.fallback)
        else:
            shard.send_packed(routed, routed.index, routed.packed, fallback=routed.fallback)

    def _shard(self, address: Address, slot: int) -> Node:
        shard = self.shards.get(address)
        if shard is None:
            endpoint = shard_endpoint(self.endpoint, address)
            if self._probe_prefix:  # (a key in a slot it serves: a key elsewhere would be MOVED, and read as 0)
                endpoint = replace(endpoint, probe_key=self._probe_prefix + tag_for(slot))
            shard = self.shards[address] = Node(
                endpoint,
                scripts=self._scripts_all,
                on_ready=self._shard_connected,
                on_identified=self._identified,
                on_unreachable=self._lost_shard,
                on_fault=self._on_shard_fault,
                **self._settings,
            )
            self._first_slot[shard] = slot
            if self.owners[slot] is not None:
                self.newcomers.add(shard)
        return shard

    def _identified(self, shard: Node) -> str | None:
        if self.shard_identified is not None:
            self.shard_identified(shard)
        return None  # (never refused: a shard's primary is the map's)

    def _shard_connected(self, shard: Node) -> None:
        """A new connection to *shard*: its replication id read first (what a later change is seen against),
        then the shard quarantine's probe."""
        self._replids.pop(shard, None)

        def read(reply: Reply) -> None:
            if isinstance(reply, bytes) and (replid := info_fields(reply).get(b"master_replid")):
                self._replids[shard] = replid

        shard.send_first((Reaction(read), (b"INFO", b"replication")))
        if self._shard_ready is not None:
            self._shard_ready(shard)

    def _lost_shard(self, shard: Node) -> None:
        self.refresh_soon()  # a primary that cannot be reached may have been replaced: who serves its slots now?
        if self._shard_unreachable is not None:
            self._shard_unreachable(shard)

    # -- the slot map -------------------------------------------------------

    def refresh_soon(self) -> None:
        """Read the slot map again in the background (one reading at a time)."""
        if self.outbox.closed is not None:
            return
        if self._refreshing is None or self._refreshing.done():
            loop = asyncio.get_running_loop()
            self._refreshing = loop.create_task(self.refresh(), name=f"redlock-slots {self.name}")

    async def refresh(self) -> bool:
        """Read the slot map (``CLUSTER SHARDS``, ``CLUSTER SLOTS`` where that is unknown) from the connected
        primaries, or else from the seeds and every primary met (``_cluster_map.py``), and route by it from
        now on; False when no node answered (:attr:`map_error` says why)."""
        self._stale_at = _clock.now() + REFRESH
        connected = [shard for shard in self.shards.values() if shard.connected]
        answer = await ask_primaries(connected, self._ask_within)
        if answer is None:
            seeds = tuple(dict.fromkeys((*self.endpoint.seeds, *self.shards)))
            try:
                answer = await ask_seeds(replace(self.endpoint, seeds=seeds), self._ask_within)
            except MapError as exc:
                if not self.map_error:  # once per outage
                    log.warning("redlock node %s: cannot read the slot map: %s", self.name, exc)
                self.map_error = str(exc)
                return False
        self.map_error = ""
        ranges, self.sharded, plain = answer
        if plain and not self._told_plain:
            self._told_plain = True
            log.warning("redlock node %s: %s", self.name, plain)
        self._apply(ranges)
        self.refreshes += 1
        for told in tuple(self.map_read):
            told()
        # A primary whose replication id changed on the same connection was a replica meanwhile (demoted,
        # then promoted back): its data was replaced; its connection is dropped and the next one judged.
        ids = await replication_ids([shard for shard in self._serving if shard.connected], self._ask_within)
        for shard, replid in ids.items():
            if self._replids.get(shard, replid) != replid:
                del self._replids[shard]
                drop(shard)
        return True

    async def _keep_fresh(self) -> None:
        """Read the map every :data:`REFRESH` seconds, used or not, while the voter is open."""
        while True:
            await asyncio.sleep(REFRESH)
            with contextlib.suppress(Exception):
                await self.refresh()

    def _apply(self, ranges: Ranges) -> None:
        owners = self.owners
        for first, last, address in ranges:
            shard = self._shard(address, first)
            owners[first : last + 1] = [shard] * len(owners[first : last + 1])  # (the map's length kept)
        serving = set(self.primaries())
        # A primary that left the map (demoted to a replica, or emptied), and one that served nothing and
        # serves again (a demoted primary promoted back): its connection is dropped, and the next one is
        # judged by the shard quarantine (a replica's data replaced its own) before any vote of it counts.
        for shard in serving.symmetric_difference(self._serving):
            if shard in self._serving or self.refreshes:
                drop(shard)
        self._serving = serving

    # -- lifecycle ----------------------------------------------------------

    async def connect(self) -> Failure | None:
        """Read the slot map and connect to every primary in it; None when one at least answered (the others are
        named in a warning: only their names lack this voter's vote)."""
        if self._keeping is None and self.outbox.closed is None:
            self._keeping = asyncio.get_running_loop().create_task(self._keep_fresh(), name=f"redlock-map {self.name}")
        if not await self.refresh():
            return Failure(Vote.ERROR, self.map_error)
        primaries = self.primaries()
        return _reached(self.name, primaries, await asyncio.gather(*(shard.connect() for shard in primaries)))

    async def aclose(self, grace: float) -> None:
        self._stop_tasks()
        await asyncio.gather(*(shard.aclose(grace) for shard in self.shards.values()))
        await Node.aclose(self, grace)

    def _stop_tasks(self) -> None:
        """The map's keeping and a reading under way stop."""
        for task in (self._keeping, self._refreshing):
            if task is not None:
                task.cancel()
        self._keeping = self._refreshing = None

    def close_now(self) -> None:
        self._stop_tasks()
        for shard in self.shards.values():
            shard.close_now()
        Node.close_now(self)


def _reached(name: str, primaries: list[Node], failures: list[Failure | None]) -> Failure | None:
    """A Cluster voter's connect: a failure only when no primary answered; the primaries not reached are named
    in a warning (only the names in their slots lack this voter's vote)."""
    missing = [f"{shard.name}: {failure.detail}" for shard, failure in zip(primaries, failures, strict=True) if failure]
    if not missing:
        return None
    if len(missing) == len(primaries):
        return Failure(Vote.ERROR, "shard primaries not reached: " + "; ".join(missing))
    # Up for the names of every other shard: said here, not as the whole voter down (no lock granted).
    log.warning(
        "redlock node %s: shard primaries not reached: %s: the names in their slots get no vote of this voter"
        " until they are; the other shards vote",
        name,
        "; ".join(missing),
    )
    return None
