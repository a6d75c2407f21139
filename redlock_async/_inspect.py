"""Read who holds a lock, writing nothing to any node.

An inspection opens connections of its own that send nothing but the
handshake (AUTH, SELECT, CLIENT SETNAME, INFO) and reads (GET, PTTL): no
restart-quarantine marker, no script loaded or run, no PUBLISH. So it can
never change what a locking client decides (a marker written under its
period would vouch for a restarted node to clients with longer leases).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redlock_async._algorithm import Held, Vote, held_by_majority, quorum
from redlock_async._endpoint import Endpoint
from redlock_async._node import Failure, Node
from redlock_async._settings import Settings


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node's answer: its key's holder (a digest of the token, never the token), ttl and fencing counter."""

    address: str
    state: str
    """"held", "free" or "unreachable"."""
    holder: str | None = None
    ttl: float | None = None
    fencing_counter: int | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Inspection:
    state: Held
    holder: str | None
    """The digest of the majority holder's token, when held."""
    ttl: float | None
    """Seconds the majority holder's keys have left (the shortest of them), when held."""
    fencing_counter: int | None
    """The largest fencing counter that answered, None when none exists."""
    nodes: tuple[NodeView, ...]

    @property
    def quorum(self) -> int:
        return quorum(len(self.nodes))


def digest(token: bytes) -> str:
    """How a holder is shown: enough to tell holders apart, useless to extend or release a lease."""
    return hashlib.sha1(token).hexdigest()[:8]


async def inspect(endpoints: Sequence[Endpoint], key: bytes, fence_key: bytes, settings: Settings) -> Inspection:
    """Ask every node for *key* (GET, PTTL) and *fence_key* (GET), at once, within the connect timeout."""
    nodes = [
        Node(
            endpoint,
            max_queued=settings.max_queued,
            stall_after=settings.connect_timeout,
            connect_timeout=settings.connect_timeout,
            reconnect_delay=settings.reconnect_delay,
        )
        for endpoint in endpoints
    ]
    try:
        asks = [[node.send(b"GET", key), node.send(b"PTTL", key), node.send(b"GET", fence_key)] for node in nodes]
        # A connect, then a round trip; a node that says nothing by then is unreachable.
        await asyncio.wait([fut for ask in asks for fut in ask], timeout=settings.connect_timeout * 2)
    finally:
        for node in nodes:
            node.close_now()
        await asyncio.sleep(0)  # the transports close their sockets on the next loop turn
    views = []
    for node, ask in zip(nodes, asks, strict=True):
        replies: list[Any] = [fut.result() if fut.done() else Failure(Vote.TIMEOUT, "no answer") for fut in ask]
        failed = next((reply for reply in replies if isinstance(reply, Failure)), None)
        if failed is not None:
            views.append(NodeView(node.name, "unreachable", error=failed.detail or failed.vote.value))
            continue
        value, pttl, fence = replies
        counter = int(fence) if fence is not None else None
        if value is None:
            views.append(NodeView(node.name, "free", fencing_counter=counter))
        else:
            ttl = int(pttl) / 1000 if int(pttl) >= 0 else None
            views.append(NodeView(node.name, "held", holder=digest(value), ttl=ttl, fencing_counter=counter))
    return judge(tuple(views))


def judge(views: tuple[NodeView, ...]) -> Inspection:
    counts: dict[str, int] = {}
    for view in views:
        if view.holder is not None:
            counts[view.holder] = counts.get(view.holder, 0) + 1
    unreachable = sum(view.state == "unreachable" for view in views)
    state = held_by_majority(len(views), counts.values(), unreachable)
    holder = max(counts, key=counts.__getitem__) if state is Held.HELD else None
    ttls = [view.ttl for view in views if view.holder == holder and view.ttl is not None]
    counters = [view.fencing_counter for view in views if view.fencing_counter is not None]
    return Inspection(
        state=state,
        holder=holder,
        ttl=min(ttls) if holder is not None and ttls else None,
        fencing_counter=max(counters) if counters else None,
        nodes=views,
    )
