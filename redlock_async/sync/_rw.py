"""The blocking ``ReadWriteLock``: ``read()`` and ``write()`` make blocking :class:`Lock` fronts over the
async read/write lock's readers and writer, run on the background loop; a writer's ``downgrade()``
makes a blocking reader whose first acquire is the async writer's downgrade."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import final

from redlock_async.client import Redlock as AsyncRedlock
from redlock_async.lock import Lock as AsyncLock
from redlock_async.rwlock import ReadWriteLock as AsyncReadWriteLock
from redlock_async.rwlock import WriteLock as AsyncWriteLock
from redlock_async.sync._lock import Lock, MakeLock
from redlock_async.sync._runtime import Runtime

Make = Callable[[AsyncRedlock, "float | None"], AsyncReadWriteLock]
"""The async read/write lock of a Redlock, with the acquire timeout given to ``acquire()`` (None: its own)."""


@final
class ReadWriteLock:
    """The blocking twin of :class:`redlock_async.ReadWriteLock` (made by ``Redlock.rw_lock``):
    ``with rw.read():`` holds together with other readers, ``with rw.write():`` alone."""

    __slots__ = ("_interrupt_main", "_make", "_runtime", "name")

    def __init__(self, runtime: Runtime, name: str | bytes, make: Make, *, interrupt_main: bool = False) -> None:
        self._runtime = runtime
        self._make = make
        self._interrupt_main = interrupt_main
        self.name = name
        """The name given to ``rw_lock()``."""

    def __repr__(self) -> str:
        return f"<redlock_async.sync.ReadWriteLock {self.name!r}>"

    def read(self) -> Lock:
        """A reader (a blocking :class:`Lock`): held together with other readers, never with a writer."""

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return self._make(twin, timeout).read()

        return Lock(self._runtime, self.name, make, interrupt_main=self._interrupt_main)

    def write(self) -> WriteLock:
        """The writer (a blocking :class:`WriteLock`): held alone; a writer that waits keeps new readers out."""

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return self._make(twin, timeout).write()

        return WriteLock(self, self._runtime, self.name, make, interrupt_main=self._interrupt_main)

    def _downgrade(self, writer: WriteLock) -> Lock:
        if not writer.held:
            with contextlib.suppress(RuntimeError):  # (check() of a writer not held)
                writer.check()  # lost, or its validity ran out: its LockLost
            raise RuntimeError(f"downgrade() of read/write lock {self.name!r}, whose writer is not held")
        held = writer.current()
        assert isinstance(held, AsyncWriteLock)
        first = held.downgrade()  # made here, in the caller's thread, as every async lock of this API is
        generation = self._runtime.generation

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            # Whatever the acquire timeout, the first acquire is the downgrade (a step, never a wait) while
            # the writer is held in this process; once it ran (the writer is then released) a plain reader's.
            if held.held and self._runtime.generation == generation:
                return first
            return self._make(twin, timeout).read()

        return Lock(self._runtime, self.name, make, interrupt_main=self._interrupt_main)


@final
class WriteLock(Lock):
    """The writer of a blocking read/write lock: a blocking :class:`Lock`, and :meth:`downgrade`.
    It overrides nothing of Lock."""

    __slots__ = ("_rw",)

    def __init__(
        self, rw: ReadWriteLock, runtime: Runtime, name: str | bytes, make: MakeLock, *, interrupt_main: bool
    ) -> None:
        self._rw = rw
        super().__init__(runtime, name, make, interrupt_main=interrupt_main)

    def downgrade(self) -> Lock:
        """A reader whose first acquire turns this held writer into it in one step, as the async
        ``WriteLock.downgrade()``: ``with writer.downgrade() as reader:``. No other writer can come
        between; other readers may join as soon as the writer's key is gone from a majority (stop
        writing before). Done on a majority, this writer is released (leaving its ``with`` block
        releases nothing more) and the reader holds; not done, the writer is lost and the reader's
        ``with`` raises :class:`LockLost`."""
        return self._rw._downgrade(self)
