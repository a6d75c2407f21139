"""How a Cluster voter's command travels (``_cluster_voter.py``): the receiver of one routed command, which
follows ``MOVED``/``ASK`` and turns a busy shard's answer into the voter's timeout, and the one that puts together
the GETs an ``MGET`` of several slots is read as."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Protocol

from redlock_async._core import Vote
from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._node import Node
from redlock_async._nodes._slots import Address, redirect
from redlock_async._nodes._wire import Failure, Fallback, Receiver, Reply, eval_again
from redlock_async._scripts import Script


class Router(Protocol):
    """What a routed command needs of its voter (``ClusterVoter``)."""

    answering: Node | None

    def redirected(self, routed: Routed, kind: str, slot: int, address: Address, /) -> None: ...


MAX_HOPS = 3
"""Redirections (``MOVED``, ``ASK``) one command follows before it counts as the voter's timeout."""

BUSY = ("TRYAGAIN", "CLUSTERDOWN")

CROSSSLOT_HINT = (
    " (a Cluster voter runs a script only when all its keys are in one slot: the grant queue, fencing,"
    " lock_many, semaphores and read/write locks need a name whose keys share one, such as a name with a"
    " hash tag, '{orders}:42'; or use queue=False without fencing)"
)


class Routed:
    """The receiver of one routed command: follows ``MOVED``/``ASK``, turns ``TRYAGAIN``/``CLUSTERDOWN``
    into a timeout, and hands every other reply on, with the voter's quarantine read as the answering
    shard's."""

    __slots__ = ("asked", "fallback", "hops", "index", "limited", "packed", "receiver", "shard", "voter")

    def __init__(
        self,
        voter: Router,
        receiver: Receiver,
        index: int,
        packed: bytes,
        limited: bool,
        fallback: Fallback,
        shard: Node,
    ) -> None:
        self.voter, self.receiver, self.index, self.packed = voter, receiver, index, packed
        self.limited, self.fallback, self.shard, self.hops = limited, fallback, shard, 0
        self.asked = False  # the last hop followed ASK (sent behind ASKING)

    def deliver(self, index: int, reply: Reply, /) -> None:
        if type(reply) is Failure and reply.answered:
            detail = reply.detail
            moved = redirect(detail)
            if moved is not None:
                if self.hops < MAX_HOPS:
                    self.hops += 1
                    if self.asked and moved[0] == "MOVED" and self.fallback is not None:
                        # The importing primary had lost the script (SCRIPT FLUSH): the node sent the EVAL again
                        # without ASKING, and the importing primary refused it. Sent again there, behind ASKING.
                        if not self._eval_again(self.fallback):
                            return
                        endpoint = self.shard.endpoint
                        moved = ("ASK", moved[1], (endpoint.host or "localhost", endpoint.port))
                    self.asked = moved[0] == "ASK"
                    self.voter.redirected(self, *moved)
                    return
                reply = Failure(Vote.TIMEOUT, f"redirected more than {MAX_HOPS} times ({detail}): slots moving")
            elif detail.startswith(BUSY):
                reply = Failure(Vote.TIMEOUT, f"the shard cannot serve now ({detail})")
            elif detail.startswith("CROSSSLOT"):
                reply = Failure(Vote.ERROR, detail + CROSSSLOT_HINT, answered=True)
        voter = self.voter
        voter.answering = self.shard
        try:
            self.receiver.deliver(self.index, reply)
        finally:
            voter.answering = None

    def _eval_again(self, fallback: tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]]) -> bool:
        """Route this script as EVAL from now on, to run after every command the answering shard has on the wire
        or in line, if ``_wire.eval_again`` says it may; False when it may not (its failure delivered)."""
        outbox = self.shard.outbox
        again = eval_again(fallback, (entry[3] for entry in (*outbox.inflight, *outbox.pending)))
        if isinstance(again, Failure):
            self.receiver.deliver(self.index, again)
            return False
        self.packed, self.fallback = again, None
        return True


def judging(answering: Node | None, serving: set[Node]) -> Node | None:
    """The shard whose quarantine is a voter's now: the one whose reply is being delivered (a ballot counts a
    vote as it is delivered), else, read at any other time (a grant queue's claim deciding later,
    statistics), the one that sits out longest: nothing that counts later may count a yes of a shard that
    sits out."""
    if answering is None and serving:
        return max(serving, key=until)
    return answering


def until(shard: Node) -> float:
    return shard.quarantined_until


def drop(shard: Node) -> None:
    """Drop *shard*'s connection (heard as any other end: the next use reconnects, and is probed first)."""
    transport = shard.outbox.transport
    if transport is not None:
        transport.abort()


class Gather:
    """The receiver of the GETs an MGET of keys in several slots is read as: one list, or the first failure."""

    __slots__ = ("_future", "_left", "_replies")

    def __init__(self, future: asyncio.Future[Reply], count: int) -> None:
        self._future, self._left, self._replies = future, count, [None] * count

    def deliver(self, index: int, reply: Reply, /) -> None:
        self._replies[index] = reply
        self._left -= 1
        if self._left or self._future.done():
            return
        failed = next((one for one in self._replies if isinstance(one, Failure)), None)
        self._future.set_result(failed if failed is not None else list(self._replies))


def shard_endpoint(endpoint: Endpoint, address: Address) -> Endpoint:
    """Where a Cluster voter (*endpoint*) reaches its node at *address*: its settings, that address."""
    host, port = address
    return replace(
        endpoint,
        name=f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
        host=host,
        port=port,
        seeds=(),
        server_hostname=host if endpoint.tls is not None else None,
    )
