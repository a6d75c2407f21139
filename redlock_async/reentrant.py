"""``ReentrantLock``: a lock its task may enter again at once (``redlock.lock(name, reentrant=True)``).

A front over a :class:`Lock` of its own: the first entry of a task takes that Lock as any lock is
taken; an entry of the same task while it holds the name (through this front or another reentrant
one of the name, of the same Redlock) joins that hold instead (``_reentry``): nothing is sent, and
it shows the hold's lease. The key is released at the outermost exit. Other tasks, child tasks too,
wait as for any lock (``_reentry`` says why).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Self, final

from redlock_async._core import Hold, Name, Reentries, resource_key
from redlock_async.errors import NodeOutcome
from redlock_async.lock import Lock
from redlock_async.statistics import LockStatistics

if TYPE_CHECKING:
    from collections.abc import Callable

    from redlock_async.errors import LockLost

__all__ = ["ReentrantLock"]


@final
class ReentrantLock:
    """A distributed lock on one name that the task holding it may enter again at once.

    The :class:`Lock` API (``async with``, ``acquire``, ``extend``, ``release``, ``held``,
    ``validity``, ``token``, ``fencing_token``, the watchdog, ``LockLost``). A nested entry by the task
    that holds it (``async with`` or ``acquire()``, through this object or another reentrant lock of
    the name) returns at once; each entry is left by its own exit (or ``release()``), and the key is
    released with the first entry's. Made by ``redlock.lock(name, reentrant=True)``.
    """

    __slots__ = ("_joins", "_key", "_lock", "_reentries")

    def __init__(self, lock: Lock, reentries: Reentries) -> None:
        self._lock = lock
        self._reentries = reentries
        self._key = resource_key("", lock.names[0])
        self._joins: list[Hold] = []  # the holds this object joined, innermost last

    def __repr__(self) -> str:
        return f"<redlock_async.ReentrantLock {self.name!r} {'held' if self.held else 'not held'}>"

    def _holder(self) -> Lock:
        """The Lock whose lease this object shows: the joined hold's, or its own."""
        return self._joins[-1].lock if self._joins else self._lock

    @property
    def name(self) -> Name:
        """The name given to ``lock()``."""
        return self._lock.names[0]

    @property
    def names(self) -> tuple[Name, ...]:
        return self._lock.names

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def owner(self) -> str:
        return self._lock.owner

    @property
    def held(self) -> bool:
        """True while the hold this object entered (its own or the one it joined) is held and valid."""
        return self._holder().held

    @property
    def validity(self) -> float:
        return self._holder().validity

    @property
    def token(self) -> str | None:
        return self._holder().token

    @property
    def fencing_token(self) -> int | None:
        return self._holder().fencing_token

    @property
    def fencing_tokens(self) -> dict[Name, int] | None:
        return self._holder().fencing_tokens

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        return self._holder().outcomes

    @property
    def depth(self) -> int:
        """Entries of this task open on its hold of the name (0 when it holds none)."""
        hold = self._reentries.find(self._key, asyncio.current_task())
        return 0 if hold is None else hold.depth

    @property
    def on_lost(self) -> Callable[[LockLost], object] | None:
        return self._lock.on_lost

    def statistics(self) -> LockStatistics:
        return self._holder().statistics()

    def _join(self) -> bool:
        """Join the current task's hold of the name, if it has one that is held: True when joined."""
        hold = self._reentries.find(self._key, asyncio.current_task())
        if hold is None or not hold.lock.held:
            return False
        hold.depth += 1
        self._joins.append(hold)
        return True

    async def acquire(self, *, blocking: bool = True, timeout: float | None = None) -> bool:
        """As :meth:`Lock.acquire`; when the current task holds the name (through a reentrant lock of this
        Redlock), True at once, joining that hold."""
        if self._join():
            return True
        acquired = await self._lock.acquire(blocking=blocking, timeout=timeout)
        if acquired:
            self._reentries.granted(self._key, asyncio.current_task(), self._lock)
        return acquired

    async def extend(self, ttl: float | None = None) -> None:
        """As :meth:`Lock.extend`, of the hold this object entered."""
        await self._holder().extend(ttl)

    async def release(self) -> None:
        """Leave the innermost entry: a join ends at once; the hold's own release deletes the key (refused
        while joins are open on it: they are left first, as nested blocks are)."""
        if self._joins:
            self._joins.pop().depth -= 1
            return
        self._check_no_joins()
        try:
            await self._lock.release()
        finally:
            self._reentries.ended(self._key, self._lock)  # released, or failed (ReleaseFailed): not held either way

    def _check_no_joins(self) -> None:
        hold = self._reentries.find(self._key, asyncio.current_task())
        if hold is not None and hold.lock is self._lock and hold.depth > 0:
            raise RuntimeError(
                f"release() of reentrant lock {self.name!r} while {hold.depth} nested entries of this task are "
                "still joined to it: leave them first (inner blocks exit before outer ones)"
            )

    async def __aenter__(self) -> Self:
        if self._join():
            return self
        await self._lock.__aenter__()
        self._reentries.granted(self._key, asyncio.current_task(), self._lock)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._joins:
            self._joins.pop().depth -= 1  # a join: the hold goes on (a loss reaches the outermost exit)
            return
        try:
            await self._lock.__aexit__(exc_type, exc, tb)
        finally:
            self._reentries.ended(self._key, self._lock)
