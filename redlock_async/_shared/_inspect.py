"""Read who holds a lock (and the permits of a semaphore, the writer and readers of a read/write lock of
the same name), writing nothing to any node.

An :class:`Inspector` has connections of its own that send nothing but the
handshake (AUTH, SELECT, CLIENT SETNAME), the restart-quarantine probe (INFO,
GET of the marker) and reads (TIME, MGET, GET, PTTL, SMEMBERS): no restart-quarantine marker
written, no script loaded or run, no PUBLISH. So it can never change what a
locking client decides (a marker written under its period would vouch for a
restarted node to clients with longer leases).

It judges the restart quarantine as a locking client does (read-only), and
looks at each node's clock: a node that came back without its keys, or that no
one vouched for yet, or whose clock jumped ahead (the locking connections' clock
guard holds it out, or its ``TIME``, read with the keys, is ahead of ours and of
the other nodes' by more than the drift), may have lost keys. What it shows
still counts toward a holder's majority (a node can lose a key, never invent
one), never toward "free": a verdict is never wrong, at worst ``unknown``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redlock_async._core import (
    Held,
    RwKeys,
    SemaphoreKeys,
    Settings,
    Vote,
    drift,
    fence_key,
    held_by_majority,
    quorum,
    resource_key,
    rw_keys,
    rw_writer_key,
    semaphore_keys,
)
from redlock_async._core import clock as _clock
from redlock_async._health import EVICTED, Quarantine, ShardQuarantine
from redlock_async._nodes import ClusterVoter, Endpoint, Failure, Node, Reply
from redlock_async._rounds import owner_of
from redlock_async._scripts import FENCED_BY
from redlock_async._shared import _rw_readers
from redlock_async.inspection import LockInfo, LockState, NodeInfo


def digest(token: bytes) -> str:
    """How a holder is shown: enough to tell holders apart, useless to extend or release a lease."""
    return hashlib.sha1(token).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class Keys:
    """What one inspection reads: a lock's key and its fence, and a semaphore's slots."""

    lock: bytes
    fence: bytes
    semaphore: SemaphoreKeys | None = None
    """A semaphore of the same name: its keys (None: not looked at)."""
    writer: bytes | None = None
    """A read/write lock of the same name: its writer key (None: not looked at)."""
    rw: RwKeys | None = None
    """Its writer key's companions (with ``writer``)."""
    rw_fence: bytes | None = None
    """The fencing counter its writers raise (with ``writer``): ``fence``, or with *one_slot*, one in the
    writer key's cluster slot."""


def keys_of(settings: Settings, name: str | bytes, *, semaphore: bool = True, one_slot: bool = False) -> Keys:
    """The keys of lock *name* (and, with *semaphore*, of semaphore *name* and read/write lock *name*),
    after checking the name; *one_slot*: as a Redlock with a cluster voter names them
    (``_names.one_slot_voters``)."""
    lock = resource_key(settings.key_prefix, name)
    fence = fence_key(settings.fence_prefix, name, lock if one_slot else None)
    if not semaphore:
        return Keys(lock, fence)
    writer = rw_writer_key(settings.key_prefix, name)
    rw_fence = fence_key(settings.fence_prefix, name, writer) if one_slot else fence
    return Keys(lock, fence, semaphore_keys(settings.key_prefix, name), writer, rw_keys(writer, one_slot), rw_fence)


def default_period(settings: Settings) -> float:
    """The restart quarantine of a client with these settings that has made no lock yet."""
    if settings.restart_quarantine is not None:
        return settings.restart_quarantine
    return settings.ttl + drift(settings.ttl, settings.drift_factor)


class Inspector:
    """Read-only connections to the nodes, opened on first use and kept until closed."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        settings: Settings,
        period: Callable[[], float] | None = None,
        clock_held: Callable[[int, bytes], tuple[float, str]] | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._settings = settings
        self._period = period or (lambda: default_period(settings))
        # Per node and key: until when (monotonic) the locking connections' clock guard or eviction watch holds
        # it out (0: never), and why (a Cluster voter: the hold of the shard serving the key).
        self._clock_held = clock_held or (lambda i, key: (0.0, ""))
        self._nodes: tuple[Node, ...] = ()
        self._quarantine: Quarantine | None = None
        self._shards: ShardQuarantine | None = None

    def _connect(self) -> tuple[Node, ...]:
        if self._nodes:
            return self._nodes
        settings = self._settings
        quarantine: Quarantine | None = None  # made once the nodes are; its probe starts only on connect

        shards: ShardQuarantine | None = None

        def probe(node: Node) -> None:
            assert quarantine is not None
            quarantine.on_ready(node)

        def probe_shard(index: int, node: Node) -> None:
            assert shards is not None
            shards.on_ready(index, node)

        judged = settings.restart_quarantine != 0
        kwargs = {
            "max_unanswered": settings.max_unanswered,
            "stall_after": settings.connect_timeout,
            "connect_timeout": settings.connect_timeout,
            "reconnect_delay": settings.reconnect_delay,
        }
        self._nodes = tuple(
            ClusterVoter(
                endpoint, shard_settings=kwargs, shard_ready=functools.partial(probe_shard, i) if judged else None
            )
            if endpoint.seeds
            else Node(endpoint, on_ready=probe if judged else None, **kwargs)  # type: ignore[arg-type]
            for i, endpoint in enumerate(self._endpoints)
        )
        if judged:
            plain = [node for node in self._nodes if not isinstance(node, ClusterVoter)]
            voters = [(i, node) for i, node in enumerate(self._nodes) if isinstance(node, ClusterVoter)]
            quarantine = Quarantine(
                settings.key_prefix.encode(),
                self._period,
                plain,
                read_only=True,
                elsewhere=(lambda: shards.state() if shards is not None else None) if voters else None,
            )
            if voters:
                shards = ShardQuarantine(
                    settings.key_prefix.encode(),
                    self._period,
                    voters,
                    read_only=True,
                    elsewhere=quarantine.state if plain else None,
                )
        self._quarantine, self._shards = quarantine, shards
        return self._nodes

    async def _ask(self, asks: list[list[asyncio.Future[Reply]]]) -> list[list[Reply]]:
        """The replies to *asks* (per node); a node silent for two connect timeouts did not answer."""
        # A connect, then a round trip; a node that says nothing by then is unreachable.
        futures = [fut for ask in asks for fut in ask]
        if futures:
            await asyncio.wait(futures, timeout=self._settings.connect_timeout * 2)
        return [[fut.result() if fut.done() else Failure(Vote.TIMEOUT, "no answer") for fut in ask] for ask in asks]

    async def inspect(self, keys: Keys) -> LockInfo:
        """Ask every node for the lock's key, fence and fencer (one MGET: an atomic read), the key's PTTL
        and the semaphore's widest limit at once (and the read/write lock's writer key, fence and fencer,
        its PTTL and its readers' hash); then, if a semaphore was used, for its slots (and for readers
        of the layout before, where a node keeps them: ``_rw_readers``)."""
        fresh = not self._nodes
        nodes = self._connect()
        if fresh:  # a Cluster voter reads its slot map first (its shards' markers are found by it)
            await asyncio.gather(*(node.refresh() for node in nodes if isinstance(node, ClusterVoter)))
        reads = (keys.lock, keys.fence, keys.fence + FENCED_BY)
        asks = []
        sent = time.time()  # the wall clock: what the nodes' TIME is compared with
        received = [math.inf] * len(nodes)
        for i, node in enumerate(nodes):
            clock = node.send(b"TIME")
            clock.add_done_callback(functools.partial(_stamp, received, i))
            ask = [clock, node.send(b"MGET", *reads), node.send(b"PTTL", keys.lock)]
            if keys.semaphore is not None:
                ask.append(node.send(b"GET", keys.semaphore.widest))
            if keys.writer is not None and keys.rw is not None and keys.rw_fence is not None:
                ask += (
                    node.send(b"MGET", keys.writer, keys.rw_fence, keys.rw_fence + FENCED_BY),
                    node.send(b"PTTL", keys.writer),
                    node.send(b"HGETALL", keys.rw.readers),  # (right behind TIME: its entries are judged by it)
                )
            asks.append(ask)
        answered = await self._ask(asks)
        answers = [replies[1:] for replies in answered]
        settings = self._settings
        ahead = clocks_ahead(
            sent,
            [(replies[0], at) for replies, at in zip(answered, received, strict=True)],
            drift(settings.ttl, settings.drift_factor),
        )
        # Quarantine is read after every reply is in: each node's probe went first on its connection. A Cluster
        # voter's is its shard's that serves the lock's key (the other keys, of other slots, say nothing of it).
        for node in nodes:
            if isinstance(node, ClusterVoter):
                node.judged_by(keys.lock)
        doubts = [self._doubt(i, node, ahead[i], keys.lock) for i, node in enumerate(nodes)]
        views = tuple(
            _sat_out(_view(node, replies[0], replies[1]), doubt)
            for node, replies, doubt in zip(nodes, answers, doubts, strict=True)
        )
        info = judge(views)
        if keys.semaphore is None:
            return info
        widest = max((_limit(replies[2]) for replies in answers if len(replies) > 2), default=0)
        if widest != 0:  # a semaphore of this name on some node that answered
            info = await self._permits(info, keys.semaphore, widest, doubts)
        if keys.rw is None:
            return info
        clocks = [replies[0] for replies in answered]
        return await self._rw(info, keys.rw, [replies[3:] for replies in answers], clocks, doubts)

    def _doubt(self, i: int, node: Node, ahead: float | None, key: bytes) -> str | None:
        """Why node *i* may have lost keys (it rules no holder out then), or None: its restart quarantine
        (this inspector's judgement), evictions (its policy can evict, and it has), the locking connections'
        clock guard or eviction watch, or its clock read *ahead*. On a Cluster voter, all of it is the shard
        primary's that serves *key* (the inspected name's: every key of one name is in its slot)."""
        seen = (node.serving(key) or node) if isinstance(node, ClusterVoter) else node
        if seen.eviction and seen.evicted_keys:  # (its handshake's reading: _evictions says why it is a doubt)
            return (
                f"it evicted keys ({seen.evicted_keys} so far, maxmemory-policy {seen.eviction}): it may have lost "
                "keys, as a restarted node"
            )
        now = _clock.now()
        left = node.quarantined_until - now  # (a Cluster voter's: judged_by the inspected name's key)
        if left > 0:
            why = "not judged yet" if math.isinf(left) else f"{left:.1f} s left"
            return f"in restart quarantine ({why}): it may have lost keys"
        until, reason = self._clock_held(i, key)
        held = until - now
        if held > 0 and reason.startswith(EVICTED):
            return f"{reason} (held out by the eviction watch, {held:.1f} s left): it may have lost keys"
        if held > 0:
            why = f"held out by the clock guard, {held:.1f} s left"
            return f"its clock jumped ahead ({why}): its keys may have expired early"
        if ahead is not None:
            return f"its clock is {ahead:.3f} s ahead of ours and of another node's: its keys may have expired early"
        return None

    async def _rw(
        self,
        info: LockInfo,
        rw: RwKeys,
        answers: list[list[Reply]],
        clocks: list[Reply],
        doubts: list[str | None],
    ) -> LockInfo:
        """*info* with the read/write lock's verdicts: its writer judged as a lock, and each reader that lives
        on some node (*answers*: per node, the writer's MGET, its PTTL, the readers' hash; *clocks*: its TIME
        before them) judged as a lock (``_rw_readers``). Nothing of a read/write lock is added when no node
        that answered has its writer's key or a live reader."""
        nodes = self._nodes
        views = tuple(
            _sat_out(_view(node, replies[0], replies[1]), doubt)
            for node, replies, doubt in zip(nodes, answers, doubts, strict=True)
        )
        writer = judge(views)
        found = await _rw_readers.of_nodes(self._ask, nodes, rw, [replies[2] for replies in answers], clocks)
        readers = tuple(
            reader
            for reader in (
                judge(
                    tuple(
                        _sat_out(
                            _view(node, said, said)
                            if isinstance(said, Failure)
                            else _view(node, [said[0], None, None], said[1]),
                            doubt,
                        )
                        for node, said, doubt in zip(nodes, said_of, doubts, strict=True)
                    )
                )
                for said_of in _rw_readers.per_reader(found).values()
            )
            if reader.state != "free"
        )
        # A writer is spoken of only where some node shows its key: with none, an "unknown" is the
        # unanswered nodes', which the lock's own verdict already says (the same nodes, the same read).
        seen = any(view.holder is not None for view in views)
        shown = writer if seen and writer.state != "free" else None
        if shown is None and not readers:
            return info
        states = {info.state, *(reader.state for reader in readers), *((shown.state,) if shown else ())}
        state: LockState = "held" if "held" in states else "unknown" if "unknown" in states else "free"
        return dataclasses.replace(info, state=state, writer=shown, readers=readers)

    async def _permits(
        self, info: LockInfo, semaphore: SemaphoreKeys, widest: int, doubts: list[str | None]
    ) -> LockInfo:
        """The lock's verdict *info* with the semaphore's: each of its *widest* slots judged as a lock."""
        nodes = self._nodes
        slots = [semaphore.slot_key(i) for i in range(widest)]
        asks = [[node.send(b"MGET", *slots), *(node.send(b"PTTL", slot) for slot in slots)] for node in nodes]
        answers = await self._ask(asks)
        per_slot: list[list[NodeInfo]] = [[] for _ in slots]
        limits: dict[str, int] = {}  # holder -> the limit its token was taken under
        for node, replies, doubt in zip(nodes, answers, doubts, strict=True):
            values = replies[0]
            for i, slot_views in enumerate(per_slot):
                value = values[i] if isinstance(values, list) and len(values) == widest else values
                view = _view(node, [value, None, None] if not isinstance(value, Failure) else value, replies[1 + i])
                if view.holder is not None:
                    limits[view.holder] = _limit(value)
                slot_views.append(_sat_out(view, doubt))
        permits = tuple(judge(tuple(slot_views)) for slot_views in per_slot)
        shown = tuple(permit for permit in permits if permit.state != "free")
        held = [limits[permit.holder] for permit in permits if permit.holder is not None]
        return combine(info, shown, max(held) if held else widest)

    def close_now(self) -> None:
        if self._quarantine is not None:
            self._quarantine.close()
            self._quarantine = None
        if self._shards is not None:
            self._shards.close()
            self._shards = None
        for node in self._nodes:
            node.close_now()
        self._nodes = ()

    async def aclose(self) -> None:
        self.close_now()
        await asyncio.sleep(0)  # the transports close their sockets on the next loop turn


async def inspect(endpoints: Sequence[Endpoint], keys: Keys, settings: Settings) -> LockInfo:
    """One inspection through connections opened for it and closed after."""
    inspector = Inspector(endpoints, settings)
    try:
        return await inspector.inspect(keys)
    finally:
        await inspector.aclose()


def _limit(reply: Reply | bytes) -> int:
    """A semaphore's limit from its widest-limit key (``b"3 layout-2"``; a bare number: the layout before), or
    from a permit's token (``b"3:..."``); 0 if none."""
    if not isinstance(reply, bytes):
        return 0
    head = reply.partition(b":")[0].partition(b" ")[0]
    return int(head) if head.isdigit() else 0


def _view(node: Node, values: Reply, pttl: Reply) -> NodeInfo:
    """One node's answer: *values* is the MGET of (key, counter, fencer), or a Failure."""
    for reply in (values, pttl):
        if isinstance(reply, Failure):
            return NodeInfo(node.name, "unreachable", error=reply.detail or reply.vote.value)
    if not isinstance(values, list) or len(values) != 3:
        return NodeInfo(node.name, "unreachable", error=f"unexpected reply {values!r:.60}")
    value, fence, fencer = values
    counter = int(fence) if isinstance(fence, bytes) and fence.isdigit() else None  # not ours if not a number
    fenced_by = fencer[:8].decode(errors="replace") if isinstance(fencer, bytes) else None
    if not isinstance(value, bytes):
        return NodeInfo(node.name, "free", fencing_counter=counter, fenced_by=fenced_by)
    ttl = int(pttl) / 1000 if isinstance(pttl, int) and pttl >= 0 else None
    return NodeInfo(
        node.name,
        "held",
        owner=owner_of(value),
        ttl=ttl,
        holder=digest(value),
        fencing_counter=counter,
        fenced_by=fenced_by,
    )


def clocks_ahead(sent: float, readings: Sequence[tuple[Reply, float]], tolerance: float) -> list[float | None]:
    """Per node, how far (seconds, at least) its clock is ahead, or None: a node whose ``TIME`` is ahead of our
    wall clock by more than *tolerance*, and ahead of another node's by more than that too (so that our own
    clock, behind every node alike, or one node running behind, makes no node suspect).

    *sent* is our wall clock before the reads were sent; *readings*, per node, its ``TIME`` reply and our wall
    clock when that came in (inf when it did not). A node read its clock between the two: it is certainly
    ahead of ours by ``node - received``, and another node certainly by no more than ``its - sent``.
    """
    least: list[float] = []  # per node read: how far ahead of ours it is at least
    most: list[float] = []  # and at most
    for reply, received in readings:
        seconds = _seconds(reply)
        if seconds is None or math.isinf(received):
            least.append(math.nan)
            continue
        least.append(seconds - received)
        most.append(seconds - sent)
    slowest = min(most, default=math.inf)
    # (nan, a node not read, compares False: it is not judged)
    return [ahead if ahead > tolerance and ahead - slowest > tolerance else None for ahead in least]


def _stamp(received: list[float], i: int, _: object) -> None:
    """Node *i*'s ``TIME`` reply came in: our wall clock now."""
    received[i] = time.time()


def _seconds(reply: Reply) -> float | None:
    """A ``TIME`` reply as seconds since the epoch; None when it is not one."""
    if not isinstance(reply, list) or len(reply) != 2:
        return None
    try:
        return int(reply[0]) + int(reply[1]) * 1e-6
    except (TypeError, ValueError):
        return None


def _sat_out(view: NodeInfo, doubt: str | None) -> NodeInfo:
    """*view*, unless its node may have lost keys (*doubt*: why): then it is ``quarantined``. What it shows
    still counts toward a holder (a key there is a key), never toward free; its counters count for nothing."""
    if view.state == "unreachable" or doubt is None:
        return view
    return dataclasses.replace(view, state="quarantined", error=doubt, fencing_counter=None, fenced_by=None)


def judge(views: tuple[NodeInfo, ...]) -> LockInfo:
    """The verdict by the majority rule (``_algorithm.held_by_majority``). A node that may have lost keys
    (``quarantined``) counts toward the majority of a holder it shows (it lost keys, it invented none), and
    for free as one that did not answer: so a verdict is never wrong, at worst unknown."""
    counts: dict[str, int] = {}
    trusted: dict[str, int] = {}
    for view in views:
        if view.holder is not None:
            counts[view.holder] = counts.get(view.holder, 0) + 1
            if view.state == "held":
                trusted[view.holder] = trusted.get(view.holder, 0) + 1
    silent = sum(view.state in ("unreachable", "quarantined") for view in views)
    need = quorum(len(views))
    if counts and max(counts.values()) >= need:
        state = Held.HELD
    else:
        state = held_by_majority(len(views), trusted.values(), silent)
    holder = max(counts, key=counts.__getitem__) if state is Held.HELD else None
    holding = [view for view in views if holder is not None and view.holder == holder]
    ttls = [view.ttl for view in holding if view.ttl is not None]
    counters = sorted((view.fencing_counter for view in views if view.fencing_counter is not None), reverse=True)
    counter: int | None
    if holder is not None:
        # The holder's token, once its fence is written on a majority: those nodes name it as their
        # counter's fencer (read with the key in one MGET). Before that (a grant between its SET and
        # its fence), or for an unfenced holder, every counter is an earlier holder's: none is shown.
        fenced = sum(view.fenced_by == holder for view in holding)
        # With the fence on a majority, only nodes that did not grant it can be ahead (a late SET
        # of an earlier, failed acquisition fenced there): fewer than a majority. So the
        # majority-th largest is the token.
        counter = counters[need - 1] if fenced >= need and len(counters) >= need else None
    else:
        counter = counters[0] if counters else None  # free or unknown: the largest that answered
    return LockInfo(
        state=state.value,
        owner=holding[0].owner if holding else None,
        ttl=min(ttls) if ttls else None,
        fencing_counter=counter,
        nodes=views,
        holder=holder,
    )


def combine(lock: LockInfo, permits: tuple[LockInfo, ...], limit: int) -> LockInfo:
    """The lock's verdict with its semaphore's: held when either is; free only when both are."""
    states = {lock.state, *(permit.state for permit in permits)}
    state: LockState = "held" if "held" in states else "unknown" if "unknown" in states else "free"
    return LockInfo(
        state=state,
        owner=lock.owner,
        ttl=lock.ttl,
        fencing_counter=lock.fencing_counter,
        nodes=lock.nodes,
        holder=lock.holder,
        limit=limit,
        permits=permits,
    )
