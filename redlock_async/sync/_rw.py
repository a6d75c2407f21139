"""The blocking ``ReadWriteLock``: ``read()`` and ``write()`` make blocking :class:`Lock` fronts over the
async read/write lock's readers and writer, run on the background loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from redlock_async.client import Redlock as AsyncRedlock
from redlock_async.lock import Lock as AsyncLock
from redlock_async.rwlock import ReadWriteLock as AsyncReadWriteLock
from redlock_async.sync._lock import Lock
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

    def write(self) -> Lock:
        """The writer (a blocking :class:`Lock`): held alone; a writer that waits keeps new readers out."""

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return self._make(twin, timeout).write()

        return Lock(self._runtime, self.name, make, interrupt_main=self._interrupt_main)
