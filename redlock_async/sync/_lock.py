"""The blocking ``Lock``: a front over the async ``Lock`` (or ``Semaphore``, or a ``lock_many`` Lock)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from redlock_async.errors import LockLost, LockNotAcquired, NestedAcquire, NodeOutcome
from redlock_async.lock import Lock as AsyncLock
from redlock_async.lock import nested_acquire
from redlock_async.statistics import LockStatistics
from redlock_async.sync._hold import Holding

if TYPE_CHECKING:
    from redlock_async.client import Redlock as AsyncRedlock
    from redlock_async.sync._runtime import Runtime

log = logging.getLogger(__name__)

Name = str | bytes

MakeLock = Callable[["AsyncRedlock", float | None], AsyncLock]
"""Makes the async lock on an async Redlock, with an acquire timeout (None: the lock's own)."""


class Lock:
    """A distributed lock for blocking code: the async :class:`redlock_async.Lock` run on the background loop.

    ``with lock:`` acquires (blocking up to the acquire timeout, else :class:`LockNotAcquired`) and
    releases on exit; ``acquire()`` / ``release()`` do the same in two calls. Between them the
    watchdog extends the lease while the body runs, whatever the body does (``time.sleep`` too).

    A thread cannot be cancelled, so a lost lease is told, not enforced: :attr:`lost` is set,
    :meth:`check` raises :class:`LockLost`, leaving ``with`` (or ``release()``) raises it, and
    with ``interrupt_main=True`` it is raised in the main thread's body at once. Made by
    :meth:`redlock_async.sync.Redlock.lock` (and ``lock_many``, ``semaphore``, and a read/write
    lock's ``read()``; its ``write()`` is a :class:`WriteLock`, which adds ``downgrade()``). One thread
    at a time uses a Lock; make one per thread. A thread that asks for what it holds (this Lock again,
    another of the name, ...) gets :class:`redlock_async.NestedAcquire` at once; other threads wait.
    """

    __slots__ = (
        "__weakref__",
        "_by_timeout",
        "_current",
        "_generation",
        "_holding",
        "_interrupt_main",
        "_make",
        "_runtime",
        "name",
    )

    def __init__(
        self, runtime: Runtime, name: Name | tuple[Name, ...], make: MakeLock, *, interrupt_main: bool
    ) -> None:
        self._runtime = runtime
        self._make = make
        self.name = name
        """The name given (for ``lock_many``, the tuple of names, as :attr:`names`)."""
        self._current = make(runtime.current(), None)  # made now: bad input raises here, not at the first acquire
        self._generation = runtime.generation
        self._by_timeout: dict[float | None, AsyncLock] = {None: self._current}
        self._interrupt_main = interrupt_main
        self._holding: Holding[AsyncLock] = Holding(interrupt_main=interrupt_main)

    def _fresh(self) -> AsyncLock:
        """The current async lock; in a forked child, this process's own (the parent's, and what it held, are not)."""
        runtime = self._runtime
        runtime.current()
        if runtime.generation != self._generation:
            self._generation = runtime.generation
            self._current = self._make(runtime.current(), None)
            self._by_timeout = {None: self._current}
            self._holding = Holding(interrupt_main=self._interrupt_main)
        return self._current

    def __repr__(self) -> str:
        self._fresh()
        state = "lost" if self.lost.is_set() else "held" if self._holding.active else "idle"
        return f"<redlock_async.sync.Lock {self.name!r} {state} validity={self.validity:.3f}s>"

    # -- acquire and release -----------------------------------------------------------------------

    def acquire(self, *, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock, and keep it (the watchdog) until :meth:`release`; True when acquired.

        Blocking (the default) retries until *timeout* seconds (default: the lock's
        ``acquire_timeout``) have passed; ``blocking=False`` makes one attempt. Nothing is left on
        any node when it returns False or is interrupted (Ctrl-C). The hold is this thread's until
        released: its nested acquires of the name raise :class:`redlock_async.NestedAcquire` at once.
        """
        if not isinstance(blocking, bool):
            raise TypeError(
                f"blocking must be True or False, got {type(blocking).__name__}: for a time limit, pass timeout="
            )
        if not blocking and timeout is not None:
            raise ValueError("acquire(blocking=False) makes one attempt: a timeout means nothing there; drop one")
        try:
            self._enter(0.0 if not blocking else timeout)
        except LockNotAcquired:
            return False
        return True

    def release(self) -> None:
        """Release the lock (on every node where it is still this acquisition's) and stop extending it.

        Raises :class:`LockLost` when the lease was lost while held (the body ran, at least in part,
        without the lock), :class:`ReleaseFailed` when the release answered errors on so many nodes
        that no majority is left free (the key stays there until it expires); releasing a lock that
        is not held is a RuntimeError.
        """
        self._fresh()
        self._holding.leave(self._runtime.portal)

    def __enter__(self) -> Self:
        self._enter(None)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.release()
        except LockLost as lost:
            if exc is None:
                raise  # the body finished, but not under the lock the whole time
            if exc is not lost:
                log.warning("redlock %r: %s (while the body raised %r)", self.name, lost, exc)
        except Exception as failed:
            if exc is None:
                raise
            # Never let a release problem mask what the body raised: it goes with it, as a note.
            log.exception("redlock %r: release failed after the body raised", self.name)
            exc.add_note(f"redlock: and then leaving `with` failed: {type(failed).__name__}: {failed}")

    def _enter(self, timeout: float | None) -> None:
        runtime = self._runtime
        portal = runtime.portal()
        self._fresh()
        holding = self._holding
        user = holding.claim()  # before anything changes: the held acquisition's state stays as it is
        if user is not None:
            raise self._refusal(user)
        try:
            lock = self._by_timeout.get(timeout)
            if lock is None:
                # An async lock per acquire timeout (the async `async with` takes the lock's own): the lock's
                # own, blocking=False's and the last other one are kept (a deadline's timeouts all differ).
                if len(self._by_timeout) > 2:
                    self._by_timeout = {key: kept for key, kept in self._by_timeout.items() if key in (None, 0.0)}
                lock = self._by_timeout[timeout] = self._make(runtime.current(), timeout)
        except BaseException:
            holding.unclaim()
            raise
        self._current = lock
        holding.enter(portal, lambda: lock, runtime.holders)

    def _refusal(self, user: threading.Thread) -> RuntimeError:
        """Why this Lock, acquiring or held by *user*, cannot be acquired again now: NestedAcquire when the
        current thread holds it (it would wait for itself), as the async side says it; else a misuse."""
        holding, held = self._holding, self._current
        me = threading.current_thread()
        if user is me and holding.active:

            async def ask() -> NestedAcquire | None:
                return nested_acquire(held, me)  # on the loop thread, which changes what is bound

            nested = self._runtime.call(ask)
            if nested is not None:
                return nested
        if user is not me:
            doing = "held" if holding.active else "being acquired"
            return RuntimeError(
                f"lock {self.name!r} is {doing} by another thread ({user.name}) through this same Lock object: a "
                "Lock serves one acquisition at a time. Make one Lock per thread (threads wait for each other's "
                "locks of a name as any clients do)"
            )
        state = "being acquired" if not holding.active else "lost, not yet released" if self.lost.is_set() else "held"
        return RuntimeError(
            f"lock {self.name!r} is already {state} by this thread through this Lock, which is not reentrant: "
            "release it first (or leave its `with` block)"
        )

    def current(self) -> AsyncLock:
        """The async lock of this process's current (or last) acquisition, on the background loop
        (for the library's fronts: a writer's downgrade)."""
        return self._fresh()

    # -- a lost lease ----------------------------------------------------------------------------

    @property
    def lost(self) -> threading.Event:
        """A ``threading.Event`` set when the current acquisition's lease is lost (cleared at the next acquire)."""
        self._fresh()
        return self._holding.lost

    def check(self) -> None:
        """Raise :class:`LockLost` if the lease was lost, or its validity ran out, since it was acquired.

        For bodies that work in chunks: call it between chunks (a write after it may still come too
        late; see fencing tokens). A lock that is not held is a RuntimeError.
        """
        current = self._fresh()
        holding = self._holding
        if holding.error is not None and holding.lost.is_set():
            raise holding.error
        if not holding.active:
            raise RuntimeError(f"check() of lock {self.name!r}, which is not held: acquire it first")
        if not current.held:
            raise LockLost(
                f"lock {self.name!r}: its validity ran out (not extended in time)",
                name=str(self.name),
                outcomes=current.outcomes,
            )

    # -- state (read from the async lock; nothing is sent) -----------------------------------------

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to *ttl* seconds from now (default: the lock's ttl) on a majority, or raise LockLost."""
        lock = self._fresh()
        self._runtime.call(lambda: lock.extend(ttl))

    @property
    def held(self) -> bool:
        """True while the lock is acquired and its validity has not run out."""
        current = self._fresh()
        return self._holding.active and current.held

    @property
    def validity(self) -> float:
        """Seconds for which the lease can still be trusted (0.0 when not held)."""
        current = self._fresh()
        return current.validity if self._holding.active else 0.0

    @property
    def ttl(self) -> float:
        """Lease length in seconds for each acquire and extend."""
        return self._fresh().ttl

    @property
    def token(self) -> str | None:
        """The random value of the current acquisition, None when not held."""
        return self._fresh().token

    @property
    def owner(self) -> str:
        """The label stored with this lock's keys (default: ``<hostname>:<pid>``)."""
        return self._fresh().owner

    @property
    def names(self) -> tuple[Name, ...]:
        """The names this lock takes, deduplicated and in the order they are taken."""
        return self._fresh().names

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition (``fencing=True``), None when not held."""
        return self._fresh().fencing_token

    @property
    def fencing_tokens(self) -> dict[Name, int] | None:
        """Each name's fencing token ({name: int}), None when not held or not fenced."""
        return self._fresh().fencing_tokens

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node outcomes of the last acquire attempt, extend or release."""
        return self._fresh().outcomes

    @property
    def cooldown(self) -> float | None:
        """Seconds the keys are kept after release (``cooldown=``), None when release deletes them."""
        return self._fresh().cooldown

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock and its current (or last) acquisition; reads no node."""
        return self._fresh().statistics()
