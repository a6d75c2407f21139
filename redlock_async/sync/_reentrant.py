"""The blocking ``ReentrantLock`` (``redlock.lock(name, reentrant=True)`` of the blocking API).

The blocking twin of :class:`redlock_async.ReentrantLock`, with the thread where the async one has
the task: the first entry of a thread takes its own blocking :class:`Lock` as any lock is taken; an
entry of the same thread while it holds the name (through this front or another reentrant one of the
name, of the same blocking Redlock) joins that hold: nothing is sent, and it shows the hold's lease.
The key is released at the outermost exit. Other threads wait as for any lock: a thread is what
blocking code has for "the same caller" (the async one's task is not: each acquisition of the blocking
API runs in a holder task of its own on the background loop, ``_hold``).

Holds are kept by (name, ``threading.current_thread()``): the thread object, not its ident, which the
system reuses once a thread has ended. In a forked child the parent's holds are never joined: the
child's blocking locks are its own, not held (``Lock.held`` is False there until it acquires).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self, final

from redlock_async._core import resource_key
from redlock_async.errors import NodeOutcome
from redlock_async.statistics import LockStatistics
from redlock_async.sync._lock import Lock, Name

__all__ = ["ReentrantLock", "ThreadHolds"]


class _Hold:
    """One thread's hold of one name through a reentrant lock, and how many joins are open on it."""

    __slots__ = ("depth", "lock")

    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.depth = 0


class ThreadHolds:
    """The reentrant holds of one blocking Redlock, by (name, thread)."""

    __slots__ = ("_holds", "_mutex")

    def __init__(self) -> None:
        self._holds: dict[tuple[bytes, threading.Thread], _Hold] = {}
        self._mutex = threading.Lock()  # threads add and remove their own holds at the same time

    def find(self, key: bytes) -> _Hold | None:
        """The current thread's hold of *key*, if any."""
        with self._mutex:
            return self._holds.get((key, threading.current_thread()))

    def granted(self, key: bytes, lock: Lock) -> None:
        """*lock* was granted *key* in the current thread: its later asks join it."""
        with self._mutex:
            self._holds[(key, threading.current_thread())] = _Hold(lock)

    def ended(self, key: bytes, lock: Lock) -> None:
        """The hold of *lock* ended (released or lost): no one joins it any more."""
        with self._mutex:
            for where, hold in list(self._holds.items()):
                if where[0] == key and hold.lock is lock:
                    del self._holds[where]


@final
class ReentrantLock:
    """A blocking lock on one name that the thread holding it may enter again at once.

    The blocking :class:`Lock` API (``with``, ``acquire``, ``release``, ``extend``, ``check``,
    ``lost``, ``held``, ``validity``, tokens). A nested entry by the thread that holds it (``with`` or
    ``acquire()``, through this object or another reentrant lock of the name of the same Redlock)
    returns at once; each entry is left by its own exit (or ``release()``), and the key is released
    with the first entry's. Other threads wait as for any lock. Made by
    ``redlock.lock(name, reentrant=True)``; one object per thread, as for :class:`Lock`.
    """

    __slots__ = ("_holds", "_joins", "_key", "_lock")

    def __init__(self, lock: Lock, holds: ThreadHolds) -> None:
        self._lock = lock
        self._key = resource_key("", lock.names[0])  # "job" and b"job" are one name
        self._holds = holds
        self._joins: list[_Hold] = []  # the holds this object joined, innermost last

    def __repr__(self) -> str:
        return f"<redlock_async.sync.ReentrantLock {self.name!r} {'held' if self.held else 'not held'}>"

    def _holder(self) -> Lock:
        """The Lock whose lease this object shows: the joined hold's, or its own."""
        return self._joins[-1].lock if self._joins else self._lock

    def _join(self) -> bool:
        """Join the current thread's hold of the name, if it has one that is held: True when joined."""
        hold = self._holds.find(self._key)
        if hold is None or not hold.lock.held:
            return False
        hold.depth += 1
        self._joins.append(hold)
        return True

    # -- acquire and release -----------------------------------------------------------------------

    def acquire(self, *, blocking: bool = True, timeout: float | None = None) -> bool:
        """As :meth:`Lock.acquire`; when the current thread holds the name (through a reentrant lock of this
        Redlock), True at once, joining that hold."""
        if self._join():
            return True
        acquired = self._lock.acquire(blocking=blocking, timeout=timeout)
        if acquired:
            self._holds.granted(self._key, self._lock)
        return acquired

    def release(self) -> None:
        """Leave the innermost entry: a join ends at once; the hold's own release deletes the key (refused
        while joins are open on it: they are left first, as nested blocks are)."""
        if self._joins:
            self._joins.pop().depth -= 1
            return
        hold = self._holds.find(self._key)
        if hold is not None and hold.lock is self._lock and hold.depth > 0:
            raise RuntimeError(
                f"release() of reentrant lock {self.name!r} while {hold.depth} nested entries of this thread are "
                "still joined to it: leave them first (inner blocks exit before outer ones)"
            )
        try:
            self._lock.release()
        finally:
            self._holds.ended(self._key, self._lock)

    def __enter__(self) -> Self:
        if self._join():
            return self
        self._lock.__enter__()
        self._holds.granted(self._key, self._lock)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._joins:
            self._joins.pop().depth -= 1  # a join: the hold goes on (a loss reaches the outermost exit)
            return
        try:
            self._lock.__exit__(exc_type, exc, tb)
        finally:
            self._holds.ended(self._key, self._lock)

    # -- the hold's state ------------------------------------------------------------------------------

    @property
    def name(self) -> Name:
        """The name given to ``lock()``."""
        name = self._lock.name
        assert not isinstance(name, tuple)
        return name

    @property
    def depth(self) -> int:
        """Entries of this thread open on its hold of the name (0 when it holds none)."""
        hold = self._holds.find(self._key)
        return 0 if hold is None else hold.depth

    @property
    def lost(self) -> threading.Event:
        """As :attr:`Lock.lost`, of the hold this object entered."""
        return self._holder().lost

    def check(self) -> None:
        """As :meth:`Lock.check`, of the hold this object entered."""
        self._holder().check()

    def extend(self, ttl: float | None = None) -> None:
        """As :meth:`Lock.extend`, of the hold this object entered."""
        self._holder().extend(ttl)

    @property
    def held(self) -> bool:
        """True while the hold this object entered (its own or the one it joined) is held and valid."""
        return self._holder().held

    @property
    def validity(self) -> float:
        return self._holder().validity

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def owner(self) -> str:
        return self._lock.owner

    @property
    def names(self) -> tuple[Name, ...]:
        return self._lock.names

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
    def cooldown(self) -> float | None:
        return self._lock.cooldown

    def statistics(self) -> LockStatistics:
        return self._holder().statistics()
