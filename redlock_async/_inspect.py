"""Read who holds a lock, writing nothing to any node.

An :class:`Inspector` has connections of its own that send nothing but the
handshake (AUTH, SELECT, CLIENT SETNAME, INFO) and reads (GET, PTTL): no
restart-quarantine marker, no script loaded or run, no PUBLISH. So it can
never change what a locking client decides (a marker written under its
period would vouch for a restarted node to clients with longer leases).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from redlock_async._algorithm import Held, Vote, held_by_majority, quorum
from redlock_async._endpoint import Endpoint
from redlock_async._node import Node
from redlock_async._requests import owner_of
from redlock_async._settings import Settings
from redlock_async._wire import Failure
from redlock_async.inspection import LockInfo, NodeInfo


def digest(token: bytes) -> str:
    """How a holder is shown: enough to tell holders apart, useless to extend or release a lease."""
    return hashlib.sha1(token).hexdigest()[:8]


class Inspector:
    """Read-only connections to the nodes, opened on first use and kept until closed."""

    def __init__(self, endpoints: Sequence[Endpoint], settings: Settings) -> None:
        self._endpoints = endpoints
        self._settings = settings
        self._nodes: tuple[Node, ...] = ()

    async def inspect(self, key: bytes, fence_key: bytes) -> LockInfo:
        """Ask every node for *key* (GET, PTTL) and *fence_key* (GET) at once; a node silent for two
        connect timeouts is unreachable."""
        if not self._nodes:
            settings = self._settings
            self._nodes = tuple(
                Node(
                    endpoint,
                    max_queued=settings.max_queued,
                    stall_after=settings.connect_timeout,
                    connect_timeout=settings.connect_timeout,
                    reconnect_delay=settings.reconnect_delay,
                )
                for endpoint in self._endpoints
            )
        nodes = self._nodes
        asks = [[node.send(b"GET", key), node.send(b"PTTL", key), node.send(b"GET", fence_key)] for node in nodes]
        # A connect, then a round trip; a node that says nothing by then is unreachable.
        await asyncio.wait([fut for ask in asks for fut in ask], timeout=self._settings.connect_timeout * 2)
        views = []
        for node, ask in zip(nodes, asks, strict=True):
            replies: list[Any] = [fut.result() if fut.done() else Failure(Vote.TIMEOUT, "no answer") for fut in ask]
            failed = next((reply for reply in replies if isinstance(reply, Failure)), None)
            if failed is not None:
                views.append(NodeInfo(node.name, "unreachable", error=failed.detail or failed.vote.value))
                continue
            value, pttl, fence = replies
            counter = int(fence) if fence is not None and fence.isdigit() else None  # not ours if not a number
            if value is None:
                views.append(NodeInfo(node.name, "free", fencing_counter=counter))
            else:
                ttl = int(pttl) / 1000 if int(pttl) >= 0 else None
                views.append(
                    NodeInfo(
                        node.name,
                        "held",
                        owner=owner_of(value),
                        ttl=ttl,
                        holder=digest(value),
                        fencing_counter=counter,
                    )
                )
        return judge(tuple(views))

    def close_now(self) -> None:
        for node in self._nodes:
            node.close_now()
        self._nodes = ()

    async def aclose(self) -> None:
        self.close_now()
        await asyncio.sleep(0)  # the transports close their sockets on the next loop turn


async def inspect(endpoints: Sequence[Endpoint], key: bytes, fence_key: bytes, settings: Settings) -> LockInfo:
    """One inspection through connections opened for it and closed after."""
    inspector = Inspector(endpoints, settings)
    try:
        return await inspector.inspect(key, fence_key)
    finally:
        await inspector.aclose()


def judge(views: tuple[NodeInfo, ...]) -> LockInfo:
    """The verdict by the majority rule (``_algorithm.held_by_majority``)."""
    counts: dict[str, int] = {}
    for view in views:
        if view.holder is not None:
            counts[view.holder] = counts.get(view.holder, 0) + 1
    unreachable = sum(view.state == "unreachable" for view in views)
    state = held_by_majority(len(views), counts.values(), unreachable)
    holder = max(counts, key=counts.__getitem__) if state is Held.HELD else None
    holding = [view for view in views if holder is not None and view.holder == holder]
    ttls = [view.ttl for view in holding if view.ttl is not None]
    counters = sorted((view.fencing_counter for view in views if view.fencing_counter is not None), reverse=True)
    need = quorum(len(views))
    if holder is not None and len(counters) >= need:
        # The holder's token: its fence raised a majority's counters to it while it held the key,
        # and only nodes that did not grant it can be ahead (a late SET of an earlier, failed
        # acquisition fenced there): fewer than a majority. So the majority-th largest is the token.
        counter: int | None = counters[need - 1]
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
