"""``ReadWriteLock``: many readers or one writer of one name, over the quorum (``Redlock.rw_lock``).

``rw.read()`` and ``rw.write()`` each give a :class:`Lock` front (``async with``, ``acquire``,
``extend``, ``release``, ``held``, ``validity``, the watchdog, ``LockLost``) given a reader's or a
writer's acquire strategy (``_rw/_strategies.py``). A reader's lease is a key of its own on each node, so
readers share and each one's crash frees only its share; a writer holds the name's writer key as a
mutex holds its key, and only where no reader's key lives; a waiting writer keeps new readers out.
The per-node rule and the argument that reduces to the mutex's are in docs/algorithm.md,
"Read/write locks"; the data on each node in ``_rw/_requests.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, final

from redlock_async._core import Name, Settings, check_owner, rw_writer_key
from redlock_async._lock import loss
from redlock_async._rw import QueuedReader, QueuedWriter, Reader, Writer
from redlock_async.errors import LockLost
from redlock_async.lock import Lock, keeper_of

if TYPE_CHECKING:
    from redlock_async._shared import Cluster

__all__ = ["ReadWriteLock", "WriteLock"]


@final
class ReadWriteLock:
    """Many readers or one writer of *name*, across every client of the same nodes.

    Made by :meth:`Redlock.rw_lock`. :meth:`read` and :meth:`write` each make a new lock (one per
    task, as ``lock()`` does): readers hold together; a writer holds alone; a writer that waits keeps
    new readers out, so a stream of readers cannot starve it.
    """

    __slots__ = ("_cluster", "_key", "_on_lost", "_owner", "_settings", "name")

    def __init__(
        self,
        cluster: Cluster,
        name: Name,
        settings: Settings,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
    ) -> None:
        self._key = rw_writer_key(settings.key_prefix, name)
        self._owner = check_owner(owner)
        self._cluster = cluster
        self._settings = settings
        self._on_lost = on_lost
        self.name = name
        """The name given to ``rw_lock()``."""

    def __repr__(self) -> str:
        return f"<redlock_async.ReadWriteLock {self.name!r}>"

    @property
    def ttl(self) -> float:
        """Lease length in seconds of each reader and writer."""
        return self._settings.ttl

    def read(self) -> Lock:
        """A reader: held together with other readers, never with a writer."""
        kind = QueuedReader if self._settings.queue else Reader  # the grant queue (the default), or release words
        reader = kind(self._cluster, self._settings, self.name, self._owner, self._key)
        return Lock(self._cluster, self.name, self._settings, on_lost=self._on_lost, strategy=reader)

    def write(self) -> WriteLock:
        """A writer: held alone (no reader, no other writer); :meth:`WriteLock.downgrade` turns it into a
        reader without a gap."""
        return WriteLock(self, self._cluster, self.name, self._settings, self._on_lost)

    def _downgrade(self, writer: WriteLock) -> Lock:
        kind = QueuedReader if self._settings.queue else Reader
        reader = kind(self._cluster, self._settings, self.name, self._owner, self._key, downgrading=keeper_of(writer))
        lock = Lock(self._cluster, self.name, self._settings, on_lost=self._on_lost, strategy=reader)
        reader.successor = lock  # (until its first acquire, the downgrade, drops it)
        return lock


@final
class WriteLock(Lock):
    """The writer of a read/write lock: a :class:`Lock` given the writer's strategy, and :meth:`downgrade`.
    It overrides nothing of Lock."""

    __slots__ = ("_rw",)

    def __init__(
        self,
        rw: ReadWriteLock,
        cluster: Cluster,
        name: Name,
        settings: Settings,
        on_lost: Callable[[LockLost], object] | None,
    ) -> None:
        self._rw = rw
        writer = (QueuedWriter if settings.queue else Writer)(cluster, settings, name, rw._owner, rw._key)
        super().__init__(cluster, name, settings, on_lost=on_lost, strategy=writer)

    def __repr__(self) -> str:
        return f"<redlock_async.WriteLock {self.name!r} {self.statistics().phase}>"

    def downgrade(self) -> Lock:
        """A reader whose first acquire turns this held writer into it in one step: on each node the
        writer's key gives way to the reader's, so no other writer can come between (readers may join
        as soon as the writer's key is gone from a majority: stop writing before). ``async with
        writer.downgrade() as reader:``. Done on a majority, this writer is released and the reader
        holds (an extension of the writer in flight, the watchdog's or ``extend()``'s, goes to the
        reader); not done, the writer is lost and the acquire raises its :class:`LockLost`
        (cancelled, the writer is released). The reader's later acquires are a plain reader's.
        A writer lost before (or whose validity ran out) raises its :class:`LockLost` here; one not
        acquired, or released, a ``RuntimeError``."""
        if not self.held:
            if (lost := loss(self._keeper)) is not None:
                raise lost
            raise RuntimeError(f"downgrade() of read/write lock {self.name!r}, whose writer is not held")
        return self._rw._downgrade(self)
