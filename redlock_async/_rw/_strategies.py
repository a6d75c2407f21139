"""The read/write lock's acquire strategies (``Redlock.rw_lock``): a reader's and a writer's.

Each is given to a ``Lock`` front, as the other primitives' strategies are (``_strategies``), and
differs from ``Words`` (one name) only in what a round sends and what a release sends:

- :class:`Reader`: ``RW_READ`` (its own entry in the readers' hash, while no writer holds or waits),
  extended by ``RW_READ_EXTEND`` and released by ``RW_READ_RELEASE``; once granted, it wakes the next
  waiter of the process at once, so the readers waiting here go together. Its fencing token is the last
  writer's (read, never raised).
- :class:`Writer`: ``RW_WRITE`` (the writer key, while no reader's entry lives), entering the waiting
  writers while it waits and leaving them when its acquire ends; released, extended and fenced as a
  mutex's key.

Both are bound, inside ``async with``, to one key of the name that no node ever sees
(:func:`bound_key`): a task holding the read or the write lock that asks for either again gets
``NestedAcquire`` at once (it would wait for itself), while readers of other tasks never queue behind
each other's holds (their channel, the writer key, is not that key). Neither is handed over by a
release of this Redlock: with ``queue=False`` their waiters hear release words; through the nodes'
grant queue (the default) they wait as :class:`QueuedReader` and :class:`QueuedWriter` (below).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from redlock_async._core import Name, Settings, default_owner, fence_key, rw_keys
from redlock_async._core import algorithm as _algorithm
from redlock_async._lock import (
    Keeper,
    Successor,
    Words,
    hand_over,
    handed_over,
    line_token,
    loss,
    never_refused,
    wait_in_line,
)
from redlock_async._queue import READER, WRITER, RwLine
from redlock_async._queue import claim as _queue
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Ballot, Keep, Lease, Tenure
from redlock_async._rounds import requests as _requests
from redlock_async._rw import _requests as _rw_requests
from redlock_async._shared import Cluster

BOUND = b"\x00task"
"""After the writer key: the key a task holding the read or the write lock is bound to (never on a node)."""


def bound_key(writer_key: bytes) -> bytes:
    return writer_key + BOUND


class _Side(Words):
    """What a reader and a writer share: the keys, no hand-over, nested acquires refused."""

    __slots__ = ("fence_key", "rw", "rw_key", "rw_name")

    takes_hand_over = False
    marks = False

    def __init__(self, cluster: Cluster, settings: Settings, name: Name, owner: bytes | None, key: bytes) -> None:
        super().__init__(cluster, settings, (name,), owner, name)
        self.rw_name = name
        self.rw_key = key
        one_slot = cluster.one_slot
        self.rw = rw_keys(key, one_slot)
        """The writer key's companions (in its cluster slot when *one_slot*)."""
        self.fence_key = fence_key(settings.fence_prefix, name, key if one_slot else None) if settings.fencing else None
        self.keys = (bound_key(key),)
        self.blocked = key  # where every release of the lock is told

    def held_words(self, name: Name) -> str:
        # (Not reentrant: a writer would wait for its own read, a reader for a writer waiting behind it.)
        return f"read/write lock {name!r} (its read or its write lock: a read/write lock is not reentrant)"

    def next_is_ours(self, token: bytes) -> bool:
        return False


class Reader(_Side):
    """A reader: its own entry in the readers' hash on each node (``RW_READ``)."""

    __slots__ = ("downgrading", "permits", "successor")

    def __init__(
        self,
        cluster: Cluster,
        settings: Settings,
        name: Name,
        owner: bytes | None,
        key: bytes,
        downgrading: Keeper | None = None,
    ) -> None:
        super().__init__(cluster, settings, name, owner, key)
        self.fence_keys = ()  # a reader raises no counter: its extension is its entry's (RW_READ_EXTEND)
        self.downgrading = downgrading
        """For a downgrade: the held writer's keeper; this reader's first acquire is then the downgrade."""
        self.successor: Successor | None = None
        """For a downgrade: the reader's front, which an extension of the writer's lease in flight extends."""
        # The writer's task holds the name (bound inside `async with`): its downgrade is no nested acquire.
        self.permits = 1 if downgrading is None else 2

    async def acquire(self, tenure: Tenure, blocking: bool, give_up: float) -> bool:
        acquired = await super().acquire(tenure, blocking, give_up)
        if acquired and self.settings.wait_for_release:
            self.cluster.listener.share(self.rw_key)  # the next waiter here may come in too
        return acquired

    async def take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        cluster, settings = self.cluster, self.settings
        owner = self.owner or default_owner()
        if self.downgrading is None:
            read = await _rw_requests.attempt_read(
                cluster.nodes, self.rw_key, self.rw, self.fence_key, settings, owner, cluster.reading()
            )
            _rw_requests.refuse_old_layout(self.rw_name, read.codes, len(cluster.nodes))
            return read
        writer, self.downgrading, self.permits = self.downgrading, None, 1  # the first acquire only
        successor, self.successor = self.successor, None
        token = writer.tenure.lease.token
        if token is None or not writer.held or successor is None:
            if (lost := loss(writer)) is not None:
                raise lost  # lost (or its validity ran out) since downgrade() was called
            raise RuntimeError(f"downgrade of read/write lock {self.name!r}: its writer is no longer held")
        # From here the writer's key gives way to the reader's on each node: an extension of the writer that
        # lands after that (the watchdog's, or an extend() in flight) is refused there, which is no loss. The
        # downgrade's own votes decide whether the writer held to the end.
        hand_over(writer, successor)
        result: _requests.Attempt | None = None
        try:
            result = await _rw_requests.downgrade(
                cluster.nodes,
                self.rw_key,
                self.rw,
                token,
                self.fence_key,
                settings,
                owner,
                cluster.reading(),
                queued=settings.queue is True,
            )
        finally:
            # Synchronous, so the reader is held (by attempt(), right after this returns) before anyone told
            # of the verdict runs. The writer's key is gone wherever the downgrade ran; the writer's release
            # (compare-and-delete, so never another's) takes it from the nodes where it did not.
            if result is None:  # cancelled (or failed) before a verdict: released, as the caller asked
                handed_over(writer, None)
            elif result.validity is not None:
                handed_over(writer, True)
        if result.validity is not None:
            return result
        # Not done on a majority: the write lock cannot be shown to have held up to the read lock.
        refused = _algorithm.refused(result.votes)
        why = f"read/write lock {self.name!r} " + (
            "was lost before its downgrade: its write lock is gone from a majority of nodes (expired or taken)"
            if refused
            else "could not be downgraded on a majority of nodes in time: its write lock is given up"
        )
        lost = handed_over(writer, False, why)
        if lost is None:  # released by another task while the downgrade was out
            raise RuntimeError(f"downgrade of read/write lock {self.name!r}: its writer was released meanwhile")
        raise lost

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _rw_requests.send_read_release(self.cluster.nodes, self.rw_key, self.rw, token, skip, into)


class Writer(_Side):
    """The writer: the writer key on each node (``RW_WRITE``), released and extended as a mutex's."""

    __slots__ = ("waiter",)

    def __init__(self, cluster: Cluster, settings: Settings, name: Name, owner: bytes | None, key: bytes) -> None:
        super().__init__(cluster, settings, name, owner, key)
        self.fence_keys = () if self.fence_key is None else (self.fence_key,)
        self.waiter: bytes | None = None

    async def acquire(self, tenure: Tenure, blocking: bool, give_up: float) -> bool:
        # A blocking writer enters the waiting writers at each refused attempt (new readers wait behind
        # it) and leaves them when its acquire ends, however it ends: queued before any exception goes on.
        self.waiter = secrets.token_hex(10).encode() if blocking else None
        try:
            return await super().acquire(tenure, blocking, give_up)
        finally:
            if self.waiter is not None:
                _rw_requests.send_leave(self.cluster.nodes, self.rw_key, self.rw, self.waiter)
                self.waiter = None

    async def take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        cluster, settings, waiter = self.cluster, self.settings, self.waiter
        result = await _rw_requests.attempt_write(
            cluster.nodes,
            self.rw_key,
            self.rw,
            self.fence_key,
            settings,
            self.owner or default_owner(),
            waiter or b"",
            0 if waiter is None else _rw_requests.wait_life_ms(settings),
            cluster.reading(),
        )
        _rw_requests.refuse_old_layout(self.rw_name, result.codes, len(cluster.nodes))
        return result

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _requests.send_release(self.cluster.nodes, lease.keys, token, skip, into=into)


# -- through the grant queue ------------------------------------------------------------
# A read/write lock's reader and writer through the nodes' grant queue (``queue=True``, the default).
#
# The first try is the reader's or writer's own round (``RW_READ`` / ``RW_WRITE``, without entering the
# waiting writers): uncontended, nothing more. A try that is refused waits in the name's line on every
# node with one claim (``_queue``'s ``RwLine``), as a lock's waiter does (``_strategies.Queued``): a writer's
# release, or the last reader's, grants the head of the line on each node (readers at the head
# together, a writer alone), in any process, and the waiter holds once a majority of the nodes hold its
# key for its token. Releases go through the line (``RW_QUEUE_LEAVE``), however the lease was taken.


class QueuedReader(Reader):
    """:class:`Reader`'s first try, keys and downgrade, waiting in the name's line (``wait_in_line``)."""

    __slots__ = ()

    acquire = wait_in_line
    new_token = line_token
    check_refused = never_refused
    regains = False  # a read/write lease regains no node (docs/algorithm.md, "Read/write locks")

    @property
    def keeps(self) -> Keep | None:
        return _rw_requests.reader_keep(self.rw)  # our entry in the readers' hash: extended by a script of its own

    @property
    def channels(self) -> tuple[bytes, ...]:
        return (self.rw_key,)

    @property
    def line(self) -> RwLine:
        return RwLine(self.rw_key, self.rw, self.fence_key, READER)

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        cluster = self.cluster
        claim = _queue.Claim(
            cluster.nodes, self.rw_key, self.settings, token, self.fence_key, guard=cluster.clock, line=self.line
        )
        return [claim]

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        return (self.rw.readers,)  # (its lease: its entry there, for its token)

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _rw_requests.send_queue_leave(self.cluster.nodes, self.line, token, skip, into)


class QueuedWriter(Writer):
    """:class:`Writer`'s first try, keys and fence, waiting in the name's line (``wait_in_line``)."""

    __slots__ = ()

    acquire = wait_in_line
    new_token = line_token
    check_refused = never_refused
    keeps: Keep | None = None
    regains = False

    @property
    def channels(self) -> tuple[bytes, ...]:
        return (self.rw_key,)

    @property
    def line(self) -> RwLine:
        return RwLine(self.rw_key, self.rw, self.fence_key, WRITER)

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        cluster = self.cluster
        claim = _queue.Claim(
            cluster.nodes, self.rw_key, self.settings, token, self.fence_key, guard=cluster.clock, line=self.line
        )
        return [claim]

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        return (self.rw_key,)

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _rw_requests.send_queue_leave(self.cluster.nodes, self.line, token, skip, into)
