"""A read/write lock in the grant queue: one line per name, readers and writers in arrival order.

Its waiters wait in one line per read/write lock name, on every node (the scripts in
``_scripts/_rw_queue.py``): a writer's release, or the last reader's, grants the head of the line what
the rule on one node allows (a writer when no reader's key lives; every reader at the head up to the
next writer), and publishes one grant word per waiter granted, as a lock's line does, on the lock's
channel (its writer key W). A reader holds once a majority of the nodes hold its reader key for its
token; a writer once a majority hold W for its token (fenced: and raised the counter, ``QUEUE_FENCE``,
as for a lock). The safety argument is the read/write lock's (docs/algorithm.md, "Read/write locks in
the grant queue"): every grant keeps the rule on one node, whoever sends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from redlock_async._queue._line import KeyLine, Packed
from redlock_async._scripts import RW_ENTER, RW_QUEUE_LEAVE, RW_QUEUE_STAY

LINE, WAITS = b"\x00queue", b"\x00waits"
"""What a writer key adds for its line and its waits (as a lock key's: ``_queue.SUFFIXES``)."""

READER, WRITER = b"r", b"w"


@dataclass(frozen=True, slots=True)
class RwLine(KeyLine):
    """What a read/write lock's claim needs: its writer key (the channel) and companions
    (``_names.rw_keys``), the fencing counter, its side. As a claim's line (``_queue_line.Line``), a node
    holds the waiter's key: a reader's own, or the writer key."""

    writer_key: bytes
    companions: tuple[bytes, bytes, bytes]
    """The reader keys' prefix, the readers' index, the waiting writers (``_names.rw_keys``)."""
    fence_key: bytes | None
    kind: bytes
    """READER or WRITER."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The KEYS of every line script (``_scripts/_rw_queue.py``)."""
        w = self.writer_key
        _, index, waiting = self.companions
        keys = (w, index, waiting, w + LINE, w + WAITS)
        return keys if self.fence_key is None else (*keys, self.fence_key)

    @property
    def prefix(self) -> bytes:
        return self.companions[0]

    @property
    def fenced(self) -> bool:
        """A writer, fenced as a lock is (with a fencing counter: ``settings.fencing``)."""
        return self.kind == WRITER and self.fence_key is not None

    @property
    def reads(self) -> bool:
        """Not fenced (a reader): its token is the last writer's, the largest counter its majority read."""
        return not self.fenced

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return RW_ENTER, (token, ttl_ms, score, life_ms, self.prefix, self.kind)

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return RW_QUEUE_STAY, (token, score, life_ms, ttl_ms, self.prefix, self.kind)

    def quit(self, token: bytes) -> Packed:
        return RW_QUEUE_LEAVE, (token, self.prefix, self.kind)
