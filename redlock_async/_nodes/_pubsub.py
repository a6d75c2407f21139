"""Subscriber connections (the hand-off's, ``_shared/_handoff.py``): what a standalone node's hears, and a
Cluster voter's, which listens on sharded pub/sub.

A subscriber :class:`_node.Node` hands each list it reads to its ``on_message``, which says whether it was a
message (answering no command). :func:`messages` makes that of a listener's callback for a standalone
node: ``message`` only.

A :class:`ClusterSubscriber` is the subscriber of a ``redis+cluster://`` voter, a :class:`_node.Node` to the
listener (``SUBSCRIBE``, ``UNSUBSCRIBE``, messages) with no connection of its own. Its scripts say their words
with ``SPUBLISH`` on a channel in the name's slot (``_cluster_scripts.py``), which only the shard primary that
serves the slot carries; so a channel is ``SSUBSCRIBE``\\ d on a connection to that primary (one per primary,
opened when first needed), routed by the voter's slot map, and an ``SSUBSCRIBE`` answered ``MOVED`` goes where
it says. A channel is subscribed again where its slot is served now (the listener subscribes every channel
again, which pokes the claims waiting on them: a word may have been lost meanwhile):

- when the server drops it (an unasked ``sunsubscribe``: its slot left that primary, a migration),
- when a primary's connection comes back (a restart or failover lost its subscriptions),
- when a reading of the slot map finds another primary serving its slot (a failover, a migration), or finds
  it not subscribed anywhere (an ``SSUBSCRIBE`` that failed).

Leaving sends ``SUNSUBSCRIBE`` where the channel is. On a Cluster whose map came from ``CLUSTER SLOTS`` (servers
before 7.0: no sharded pub/sub) the same is done with plain ``SUBSCRIBE``, and the scripts ``PUBLISH``, which
every node carries.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from redlock_async._core import Vote
from redlock_async._nodes._cluster_routing import MAX_HOPS, shard_endpoint
from redlock_async._nodes._cluster_voter import ClusterVoter
from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._node import Node
from redlock_async._nodes._slots import key_slot, redirect
from redlock_async._nodes._wire import Failure, Fallback, Reply, pack

log = logging.getLogger("redlock_async._handoff")  # the hand-off's name: users' log settings name it

_refused: set[str] = set()
"""The subscriber nodes (by name) whose refusal of a subscription this process has told of (once each)."""


def tell_refused(node: Node, fut: asyncio.Future[Reply]) -> None:
    """Once per node: the subscription of the hand-off was refused (an ACL user without the command, or
    without the channel), so the waiters there are never told of a release: they still get the lock, but
    each only at its next poll. The words name what that node's subscriber sends: ``SSUBSCRIBE`` on a Cluster
    voter (sharded pub/sub), ``SUBSCRIBE`` elsewhere."""
    reply = None if fut.cancelled() else fut.result()
    if not (isinstance(reply, Failure) and "NOPERM" in reply.detail) or node.name in _refused:
        return
    _refused.add(node.name)
    if isinstance(node, ClusterSubscriber) and node.voter.sharded:
        command, allow = "SSUBSCRIBE", "+ssubscribe (a Cluster voter's waiters listen by sharded pub/sub)"
    else:
        command, allow = "SUBSCRIBE", "+subscribe"
    log.warning(
        "redlock node %s refuses %s (%s): waiters are not woken by a release there, only by their next poll;"
        " allow %s, and the channels under key_prefix (&redlock:* by default, &PREFIX* for another prefix;"
        " docs/deployment.md)",
        node.name,
        command,
        reply.detail,
        allow,
    )


def messages(hear: Callable[[list[bytes]], object]) -> Callable[[list[bytes]], bool]:
    """A standalone subscriber's ``on_message``: a ``message`` goes to *hear*; every other list answers a command."""

    def heard(reply: list[bytes]) -> bool:
        if reply[0] != b"message":
            return False
        hear(reply)
        return True

    return heard


class _Leave:
    """The receiver of our own ``SUNSUBSCRIBE`` of *channel* (told apart from the server's unasked one)."""

    __slots__ = ("channel",)

    def __init__(self, channel: bytes) -> None:
        self.channel = channel

    def deliver(self, index: int, reply: Reply, /) -> None:
        pass


class _Join:
    """The receiver of one ``SSUBSCRIBE``: follows ``MOVED`` (up to MAX_HOPS), then answers the listener as
    ``SUBSCRIBE`` would."""

    __slots__ = ("channel", "future", "hops", "link", "owner")

    def __init__(self, owner: ClusterSubscriber, channel: bytes, future: asyncio.Future[Reply]) -> None:
        self.owner, self.channel, self.future, self.hops = owner, channel, future, 0
        self.link: Node | None = None

    def deliver(self, index: int, reply: Reply, /) -> None:
        owner = self.owner
        if type(reply) is Failure and reply.answered and (moved := redirect(reply.detail)) is not None:
            owner.voter.refresh_soon()
            if moved[0] == "MOVED" and self.hops < MAX_HOPS:
                self.hops += 1
                owner.join(self, shard_endpoint(owner.voter.endpoint, moved[2]))
                return
            # ASK (a migration under way: a subscriber connection cannot send ASKING), or too many hops: the
            # next reading of the map subscribes it where the slot is served then.
            reply = Failure(Vote.TIMEOUT, f"the channel's slot is moving ({reply.detail})")
        elif isinstance(reply, list) and reply and reply[0] in (b"ssubscribe", b"subscribe"):
            owner.placed(self.channel, self.link)
            reply = [b"subscribe", *reply[1:]]
        if not self.future.done():
            self.future.set_result(reply)


class ClusterSubscriber(Node):
    """The subscriber of a Cluster voter: each channel on the primary that serves its slot (see the module)."""

    def __init__(
        self,
        voter: ClusterVoter,
        *,
        on_message: Callable[[list[bytes]], object],
        on_connect: Callable[[Node], None],
        on_fault: Callable[[Node, BaseException], None] | None = None,
        settings: dict[str, Any],
    ) -> None:
        super().__init__(voter.endpoint, on_fault=on_fault, warn=False, **settings)
        self.voter = voter
        self._hear, self._again, self._fault, self._settings = on_message, on_connect, on_fault, settings
        self.links: dict[str, Node] = {}
        """A subscriber connection per primary (by address) that a channel was sent to."""
        self.where: dict[bytes, Node] = {}
        """Each channel subscribed, and the connection that confirmed it."""
        self.wanted: set[bytes] = set()
        """The channels the listener wants, subscribed or not (yet)."""
        self._met: set[Node] = set()  # the links connected once: a connection after that one lost subscriptions
        self._again_soon = False
        self.send = self._send
        voter.map_read.append(self._map_read)

    def __repr__(self) -> str:
        return f"<ClusterSubscriber {self.name} links={len(self.links)}>"

    @property
    def connected(self) -> bool:
        return any(link.connected for link in self.links.values())

    def _send(
        self, *args: bytes | str | int, limited: bool = False, fallback: Fallback = None
    ) -> asyncio.Future[Reply]:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        command, channel = args[0], args[1]
        if not isinstance(channel, bytes) or command not in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
            fut.set_result(Failure(Vote.ERROR, f"a Cluster voter's subscriber sends no {command!r}"))
        elif command == b"SUBSCRIBE":
            self.wanted.add(channel)
            self.join(_Join(self, channel, fut), None)
        else:
            self.wanted.discard(channel)
            if (link := self.where.pop(channel, None)) is not None:
                self._leave(link, channel)
            fut.set_result([b"unsubscribe", channel, len(self.wanted)])
        return fut

    def join(self, join: _Join, endpoint: Endpoint | None) -> None:
        """Send *join*'s ``SSUBSCRIBE`` to *endpoint*, or to the primary that serves its channel's slot."""
        if endpoint is None:
            owner = self.voter.shard_for(key_slot(join.channel))
            if owner is None:
                join.deliver(0, Failure(Vote.SKIPPED, "Cluster voter: its slot map is not read yet"))
                return
            endpoint = owner.endpoint
        join.link = link = self._link(endpoint)
        command = b"SSUBSCRIBE" if self.voter.sharded else b"SUBSCRIBE"
        link.send_packed(join, 0, pack((command, join.channel)))

    def placed(self, channel: bytes, link: Node | None) -> None:
        """*link* confirmed its subscription to *channel* (left again at once if no one wants it any more)."""
        if link is None:
            return
        if channel not in self.wanted:
            self._leave(link, channel)
            return
        before = self.where.get(channel)
        if before is not None and before is not link:
            self._leave(before, channel)
        self.where[channel] = link

    def _leave(self, link: Node, channel: bytes) -> None:
        command = b"SUNSUBSCRIBE" if self.voter.sharded else b"UNSUBSCRIBE"
        if link.connected:
            link.send_packed(_Leave(channel), 0, pack((command, channel)))

    def _link(self, endpoint: Endpoint) -> Node:
        link = self.links.get(endpoint.name)
        if link is None:
            link = self.links[endpoint.name] = Node(
                endpoint,
                on_message=functools.partial(self._heard, endpoint.name),
                on_connect=self._connected,
                on_fault=self._fault,
                warn=False,
                **self._settings,
            )
        return link

    def _heard(self, name: str, reply: list[bytes]) -> bool:
        kind = reply[0]
        if kind in (b"smessage", b"message"):
            self._hear([b"message", reply[1], reply[2]])
            return True
        if kind != b"sunsubscribe":
            return False
        link = self.links.get(name)
        inflight = link.outbox.inflight if link is not None else ()
        if inflight and isinstance(head := inflight[0][1], _Leave) and head.channel == reply[1]:
            return False  # the answer to our own SUNSUBSCRIBE
        # The server's own: the channel's slot left this primary. Subscribe it where the slot is now.
        if link is not None and self.where.get(reply[1]) is link:
            del self.where[reply[1]]
        if reply[1] in self.wanted:
            self.voter.refresh_soon()
            self._subscribe_again()
        return True

    def _connected(self, link: Node) -> None:
        if link not in self._met:
            self._met.add(link)  # its first connection: the SSUBSCRIBEs sent to it go out now
            return
        # A connection again: the server (restarted, or failed over) lost what the last one subscribed.
        for channel in [channel for channel, at in self.where.items() if at is link]:
            del self.where[channel]
        self._subscribe_again()

    def _subscribe_again(self) -> None:
        """The listener subscribes every channel again (once per loop turn however many asked)."""
        if self._again_soon:
            return
        self._again_soon = True

        def again() -> None:
            self._again_soon = False
            if self.outbox.closed is None:
                self._again(self)

        asyncio.get_running_loop().call_soon(again)

    def _map_read(self) -> None:
        """A reading of the slot map: channels whose slot another primary serves now, or subscribed nowhere,
        are subscribed again; connections to addresses that serve nothing and carry no channel are closed."""
        owners, stray = self.voter.owners, False
        for channel in self.wanted:
            owner = owners[key_slot(channel)]
            link = self.where.get(channel)
            if owner is not None and (link is None or link.name != owner.name):
                stray = True
                if link is not None:
                    del self.where[channel]
                    self._leave(link, channel)
        if stray:
            self._subscribe_again()
        serving = {owner.name for owner in self.voter.primaries()}
        used = {link.name for link in self.where.values()}
        for name, link in list(self.links.items()):
            if name not in serving and name not in used and not link.unanswered:
                del self.links[name]
                self._met.discard(link)
                link.close_now()

    async def aclose(self, grace: float) -> None:
        if self._map_read in self.voter.map_read:
            self.voter.map_read.remove(self._map_read)
        await asyncio.gather(*(link.aclose(grace) for link in self.links.values()))
        await Node.aclose(self, grace)

    def close_now(self) -> None:
        if self._map_read in self.voter.map_read:
            self.voter.map_read.remove(self._map_read)
        for link in self.links.values():
            link.close_now()
        Node.close_now(self)
