"""A read/write lock's reader and writer through the nodes' grant queue (``queue=True``, the default).

The first try is the reader's or writer's own round (``RW_READ`` / ``RW_WRITE``, without entering the
waiting writers): uncontended, nothing more. A try that is refused waits in the name's line on every
node with one claim (``_queue_rw``), as a lock's waiter does (``_strategies.Queued``): a writer's
release, or the last reader's, grants the head of the line on each node (readers at the head
together, a writer alone), in any process, and the waiter holds once a majority of the nodes hold its
key for its token. Releases go through the line (``RW_QUEUE_LEAVE``), however the lease was taken.
"""

from __future__ import annotations

from collections.abc import Sequence

from redlock_async._core import reader_key, rw_keys
from redlock_async._lock import Queued
from redlock_async._queue import READER, WRITER, RwLine
from redlock_async._queue import claim as _queue
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Ballot, Keep, Lease
from redlock_async._rw import _requests as _rw_requests
from redlock_async._rw._strategies import Reader, Writer


class QueuedReader(Queued, Reader):
    """:class:`Reader`'s first try, keys and downgrade; :class:`Queued`'s wait, in the name's line."""

    __slots__ = ("claim_token",)

    regains = False  # a read/write lease regains no node (docs/algorithm.md, "Read/write locks")

    @property
    def keeps(self) -> Keep | None:  # type: ignore[override]
        return _rw_requests.keep_index(self.rw_key)  # the readers' index names us while we hold

    @property
    def channels(self) -> tuple[bytes, ...]:
        return (self.rw_key,)

    @property
    def line(self) -> RwLine:
        return RwLine(self.rw_key, rw_keys(self.rw_key), self.fence_key, READER)

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        self.claim_token = token
        cluster = self.cluster
        claim = _queue.Claim(
            cluster.nodes, self.rw_key, self.settings, token, self.fence_key, guard=cluster.clock, line=self.line
        )
        return [claim]

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        return (reader_key(self.rw_key, self.claim_token),)

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _rw_requests.send_queue_leave(self.cluster.nodes, self.line, token, skip, into)


class QueuedWriter(Queued, Writer):
    """:class:`Writer`'s first try, keys and fence; :class:`Queued`'s wait, in the name's line."""

    __slots__ = ()

    regains = False

    @property
    def channels(self) -> tuple[bytes, ...]:
        return (self.rw_key,)

    @property
    def line(self) -> RwLine:
        return RwLine(self.rw_key, rw_keys(self.rw_key), self.fence_key, WRITER)

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
