"""Evictions noticed live: a node whose ``maxmemory-policy`` can evict keys may drop a held lock's key (and
its fencing counter) at any moment, and then grant the lock to a second holder.

On such a node only (the handshake reads the policy and ``evicted_keys`` on every connection), every
command that can vote (a limited command, a script, a vote carrying the clock guard's ``TIME``) goes out
right behind an ``INFO stats`` in the same write, at no extra round trip: its reply is parsed before the
vote's, so a node whose ``evicted_keys`` grew since this client's last reading sits out before its vote is
counted. Nodes that cannot evict send nothing more (their sending methods are the outbox's own).

A node that evicted keys is treated as a restarted one: it counts toward no quorum for a quarantine
period (the longest lease plus drift: every lease that could have lost its key there has ended by then),
through the clock guard's hold (``Node.clock_held_until``, which the restart quarantine keeps), and every
lock that counted it drops it (``Keeper.node_lost``: lost when too few holders remain). A node met for
the first time with ``evicted_keys`` above 0 sits out a period too: when those evictions were, no one can
say. Fencing counters on a cluster with such a node are read with a floor (the node's time in
microseconds, as ``fence_ttl``'s expiring counters are), so a token never repeats after a counter was
evicted: see :func:`floored`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redlock_async._core import clock as _clock
from redlock_async._nodes import Node, Reply, pack

log = logging.getLogger("redlock_async._node")  # said of a node, as its connection's other words

INFO_STATS = pack((b"INFO", b"stats"))
INFO_MEMORY = pack((b"INFO", b"memory"))

RECHECK = 1.0
"""Seconds between two readings of a node's policy while it is not watched (read ahead of a vote, so an
idle node is asked nothing): a policy turned evicting live (``CONFIG SET``) is watched from the first vote
after that, and evictions since the last reading are found then."""

EVICTED = "it evicted keys"
"""How a node's hold for evictions starts its reason (``Node.quarantine_reason``)."""


def evicted_keys(info: Reply) -> int | None:
    """The ``evicted_keys`` of an INFO stats reply, None when it has none."""
    if not isinstance(info, bytes):
        return None
    at = info.find(b"\nevicted_keys:")
    if at < 0:
        return None
    value = info[at + 14 : info.find(b"\r", at + 14)].strip()
    return int(value) if value.isdigit() else None


def floored(nodes: Sequence[Node]) -> bool:
    """True when a fencing counter read on *nodes* must be floored by the node's time (a node can evict it)."""
    return any(node.eviction for node in nodes)


class EvictionWatch:
    """Per Redlock: each node's last ``evicted_keys``, read at connect and before each vote of a node whose
    policy can evict; a growth holds the node out a period and is told (*on_evicted*: node, words, and
    whether it is a new episode rather than more evictions while held out)."""

    def __init__(
        self,
        nodes: Sequence[Node],
        period: Callable[[], float],
        on_evicted: Callable[[int, str, bool], None],
    ) -> None:
        self._nodes = tuple(nodes)
        self._period = period
        self._on_evicted = on_evicted
        n = len(self._nodes)
        self._seen: list[int | None] = [None] * n
        self._run_ids: list[bytes | None] = [None] * n
        self.checked = [0.0] * n  # when each node's policy was last read (its handshake, or a recheck)

    def identified(self, i: int) -> None:
        """Node *i*'s handshake is done: watch it before its votes if its policy can evict, and read its count."""
        node = self._nodes[i]
        if node.server_id != self._run_ids[i]:
            self._run_ids[i] = node.server_id
            self._seen[i] = None  # another server process (a restart: the restart quarantine's); counted anew
        self.checked[i] = _clock.now()
        self.watch(i)
        self.count(i, node.evicted_keys)

    def watch(self, i: int) -> None:
        """Node *i*'s sending methods for its policy: watched before each vote if it can evict, else with its
        policy read again ahead of a vote every :data:`RECHECK` s (it may be turned evicting live)."""
        node = self._nodes[i]
        if node.eviction:
            node.send_packed, node.send_timed = _watched(node, self, i)
        else:
            _after_reading(node, i, self)

    def policy(self, i: int, reply: Reply) -> None:
        """An ``INFO memory`` of a recheck of node *i*, answered (before the ``INFO stats`` sent with it, and
        the vote): a policy that can evict now, with ``maxmemory`` set, watches it from here on."""
        if not isinstance(reply, bytes):
            return
        fields = dict(
            line.partition(b":")[::2] for line in reply.split(b"\r\n") if b":" in line and not line.startswith(b"#")
        )
        policy = fields.get(b"maxmemory_policy", b"")
        if fields.get(b"maxmemory", b"0") not in (b"0", b"") and policy not in (b"noeviction", b""):
            node = self._nodes[i]
            node.eviction = policy.decode(errors="replace")
            self.watch(i)

    def deliver(self, i: int, reply: Reply, /) -> None:
        """An ``INFO stats`` sent before a vote of node *i* was answered (before the vote's reply)."""
        self.count(i, evicted_keys(reply))

    def count(self, i: int, count: int | None) -> None:
        if count is None:
            return
        seen, self._seen[i] = self._seen[i], count
        node = self._nodes[i]
        if seen is None:
            if count == 0 or not node.eviction:
                return
            words = f"{EVICTED} before this client met it ({count} so far, maxmemory-policy {node.eviction})"
        elif count > seen:
            policy = node.eviction or "changed since"
            words = f"{EVICTED}: {count - seen} more (maxmemory-policy {policy}); a lock's key may be gone"
        else:
            return
        period = self._period()
        now = _clock.now()
        until = now + period
        # A new episode is told (a warning, an event); a node evicting on under it is held out longer, quietly.
        new = not (node.clock_held_until > now and node.quarantine_reason.startswith(EVICTED))
        if until > node.clock_held_until:
            node.clock_held_until = until
        if until >= node.quarantined_until:
            node.quarantined_until = until
            node.quarantine_reason = words
        if new:
            log.warning(
                "redlock node %s %s: it counts toward no quorum for %.1f s, as a restarted node; set "
                "maxmemory-policy noeviction (see docs/deployment.md)",
                node.name,
                words,
                period,
            )
        self._on_evicted(i, words, new)


def _watched(node: Node, watch: EvictionWatch, i: int) -> tuple[Callable[..., None], Callable[..., None]]:
    """*node*'s sending methods with an ``INFO stats`` ahead of each command that can vote."""
    outbox = node.outbox
    send_packed, send_timed = outbox.send_packed, outbox.send_timed

    def packed(receiver: Any, index: int, data: bytes, *, limited: bool = False, fallback: Any = None) -> None:
        if limited or fallback is not None:
            send_packed(watch, i, INFO_STATS)
        send_packed(receiver, index, data, limited=limited, fallback=fallback)

    def timed(
        clock: Any, receiver: Any, index: int, data: bytes, *, limited: bool = False, fallback: Any = None
    ) -> None:
        send_packed(watch, i, INFO_STATS)
        send_timed(clock, receiver, index, data, limited=limited, fallback=fallback)

    return packed, timed


class _PolicyReader:
    """The receiver of a recheck's ``INFO memory``."""

    __slots__ = ("watch",)

    def __init__(self, watch: EvictionWatch) -> None:
        self.watch = watch

    def deliver(self, i: int, reply: Reply, /) -> None:
        self.watch.policy(i, reply)


def _rechecked(node: Node, watch: EvictionWatch, i: int) -> tuple[Callable[..., None], Callable[..., None]]:
    """*node*'s sending methods (it cannot evict) that read its policy and ``evicted_keys`` again ahead of
    its next vote: their replies are parsed before the vote's, so evictions under a policy turned evicting
    since the last reading hold it out before that vote counts. After a reading the node sends through its
    plain methods (nothing added per command) until a timer, :data:`RECHECK` s on, puts these back."""
    outbox = node.outbox
    send_packed, send_timed = outbox.send_packed, outbox.send_timed
    reader = _PolicyReader(watch)

    def due() -> None:
        if not node.eviction and node.send_timed is send_timed:  # still plain (not watched since)
            node.send_packed, node.send_timed = wrapped

    def recheck() -> None:
        watch.checked[i] = _clock.now()
        node.send_packed, node.send_timed = send_packed, send_timed
        send_packed(reader, i, INFO_MEMORY)
        send_packed(watch, i, INFO_STATS)
        asyncio.get_running_loop().call_later(RECHECK, due)

    def packed(receiver: Any, index: int, data: bytes, *, limited: bool = False, fallback: Any = None) -> None:
        if limited or fallback is not None:
            recheck()
        send_packed(receiver, index, data, limited=limited, fallback=fallback)

    def timed(
        clock: Any, receiver: Any, index: int, data: bytes, *, limited: bool = False, fallback: Any = None
    ) -> None:
        recheck()
        send_timed(clock, receiver, index, data, limited=limited, fallback=fallback)

    wrapped: tuple[Callable[..., None], Callable[..., None]] = (packed, timed)
    return wrapped


def _after_reading(node: Node, i: int, watch: EvictionWatch) -> None:
    """Node *i* (it cannot evict) was read at its handshake: plain sending now, the rechecking methods back
    :data:`RECHECK` s on (at once where no loop runs)."""
    packed, timed = _rechecked(node, watch, i)
    plain_packed, plain_timed = node.outbox.send_packed, node.outbox.send_timed

    def due() -> None:
        if not node.eviction and node.send_timed is plain_timed:
            node.send_packed, node.send_timed = packed, timed

    node.send_packed, node.send_timed = plain_packed, plain_timed
    try:
        asyncio.get_running_loop().call_later(RECHECK, due)
    except RuntimeError:
        due()
