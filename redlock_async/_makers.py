"""The makers of a Redlock's primitives: ``lock`` (reentrant too), ``lock_many``, ``semaphore``, ``rw_lock``,
``election`` and the ``synchronized`` decorator, each from the Redlock's settings and the names it was given.

A base of :class:`redlock_async.Redlock` (as redis-py's clients take their commands from mixins): the
Redlock is the set of nodes and their lifecycle; this is what it makes on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, ParamSpec, TypeVar, overload

from redlock_async._core import Reentries, Settings, canonical_names, check_duration
from redlock_async._shared import Cluster
from redlock_async._synchronized import OnBusy, check_call, decorate_async
from redlock_async.election import Election
from redlock_async.errors import LockLost
from redlock_async.inspection import LockInfo
from redlock_async.lock import Lock
from redlock_async.reentrant import ReentrantLock
from redlock_async.rwlock import ReadWriteLock
from redlock_async.semaphore import Semaphore, check_limit

P = ParamSpec("P")
R = TypeVar("R")


class Makers:
    """Makes locks, semaphores, read/write locks and elections on one cluster, with its settings."""

    def __init__(
        self, settings: Settings, cluster: Cluster, inspect_lock: Callable[[str | bytes], Awaitable[LockInfo]]
    ) -> None:
        self.settings = settings
        self._cluster = cluster
        self._leader_of = inspect_lock  # an election's leader(): the lock alone, not a semaphore of its name
        self._reentries = Reentries()  # the holds of its reentrant locks, by name and task

    @overload
    def lock(
        self,
        name: str | bytes,
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
        reentrant: Literal[False] = False,
    ) -> Lock: ...

    @overload
    def lock(
        self,
        name: str | bytes,
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
        reentrant: Literal[True],
    ) -> ReentrantLock: ...

    @overload
    def lock(
        self,
        name: str | bytes,
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
        reentrant: bool,
    ) -> Lock | ReentrantLock: ...

    def lock(
        self,
        name: str | bytes,
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
        reentrant: bool = False,
    ) -> Lock | ReentrantLock:
        """A Lock on resource *name*; settings left as None are the Redlock's.

        *on_lost* is called with the :class:`LockLost` when the watchdog loses
        the lock inside ``async with``; the body is then told instead of cancelled.
        *owner* is a label stored with the lease, which :meth:`inspect` and ``redlock status``
        show (default: ``<hostname>:<pid>``).
        *cooldown* (seconds): at most once per period. Release keeps the keys instead of deleting
        them, set to expire *cooldown* seconds from then (as ``extend(cooldown)``), so no one
        acquires the name before that; the nodes' clocks time it, and the default restart quarantine
        does not cover it (docs/guide.md).
        *reentrant*: a :class:`ReentrantLock`, which the task holding the name (through a reentrant lock
        of this Redlock) enters again at once; the key is released at the outermost exit. Other tasks,
        child tasks too, wait as for any lock (docs/guide.md, "Nested acquires").
        """
        if not isinstance(reentrant, bool):
            raise TypeError(f"reentrant must be True or False, got {type(reentrant).__name__}")
        overrides = _given(
            ttl=ttl,
            acquire_timeout=acquire_timeout,
            fencing=fencing,
            auto_extend=auto_extend,
            max_hold=max_hold,
            max_extensions=max_extensions,
        )
        if not isinstance(name, (str, bytes)):
            raise TypeError(
                f"resource name must be str or bytes, got {type(name).__name__}: for several names, use lock_many()"
            )
        settings = self._cluster.lease_settings(self.settings, **overrides)
        if cooldown is not None:
            check_cooldown(settings, cooldown)
        lock = Lock(self._cluster, name, settings, on_lost=on_lost, owner=owner, cooldown=cooldown)
        return ReentrantLock(lock, self._reentries) if reentrant else lock

    def lock_many(
        self,
        names: Iterable[str | bytes],
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
    ) -> Lock:
        """A Lock on every one of *names* at once: each node sets all of them or none, and the
        lock is held when a majority did. Settings left as None are the Redlock's.

        Its keys are the ones single locks use, so ``lock("a")`` and ``lock_many(["a", "b"])``
        exclude each other. The names are deduplicated and taken in one order on every client
        (sorted by their bytes: :attr:`Lock.names`), so opposite orders cannot deadlock. The
        watchdog extends them together; losing any is losing the lock, and every name is released.
        """
        canonical = canonical_names(names)
        overrides = _given(
            ttl=ttl,
            acquire_timeout=acquire_timeout,
            fencing=fencing,
            auto_extend=auto_extend,
            max_hold=max_hold,
            max_extensions=max_extensions,
        )
        settings = self._cluster.lease_settings(self.settings, **overrides)
        return Lock(
            self._cluster, canonical if len(canonical) > 1 else canonical[0], settings, on_lost=on_lost, owner=owner
        )

    def semaphore(
        self,
        name: str | bytes,
        *,
        limit: int,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
    ) -> Semaphore:
        """A semaphore: at most *limit* holders of *name* at once, each holding one permit.

        Each permit is a lock of its own (one of *limit* slots), so the bound holds whenever
        single locks are safe. Every client of one semaphore must use the same *limit*: a
        different one, while a permit is held, is a ValueError at acquire. Not fenced.
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"semaphore name must be str or bytes, got {type(name).__name__}")
        check_limit(limit)
        overrides = _given(
            ttl=ttl,
            acquire_timeout=acquire_timeout,
            auto_extend=auto_extend,
            max_hold=max_hold,
            max_extensions=max_extensions,
        )
        settings = self._cluster.lease_settings(self.settings, fencing=False, **overrides)
        return Semaphore(self._cluster, name, limit, settings, on_lost=on_lost, owner=owner)

    def rw_lock(
        self,
        name: str | bytes,
        *,
        ttl: float | None = None,
        acquire_timeout: float | None = None,
        fencing: bool | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        max_extensions: int | None = None,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
    ) -> ReadWriteLock:
        """A read/write lock on *name*: ``async with rw.read():`` holds together with other readers,
        ``async with rw.write():`` alone. Settings left as None are the Redlock's.

        Every reader has a lease of its own (a crashed reader frees only its share, within its ttl); a
        writer that waits keeps new readers out; a writer may downgrade to a reader without a gap. Its
        keys are its own: ``lock(name)`` and ``rw_lock(name)`` do not exclude each other. With
        *fencing*, a writer gets a fencing token as a lock does, and a reader the last writer's
        (docs/guide.md, "Many readers or one writer").
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"read/write lock name must be str or bytes, got {type(name).__name__}")
        overrides = _given(
            ttl=ttl,
            acquire_timeout=acquire_timeout,
            fencing=fencing,
            auto_extend=auto_extend,
            max_hold=max_hold,
            max_extensions=max_extensions,
        )
        settings = self._cluster.lease_settings(self.settings, **overrides)
        return ReadWriteLock(self._cluster, name, settings, on_lost=on_lost, owner=owner)

    def election(
        self,
        name: str | bytes,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        max_hold: float | None = None,
    ) -> Election:
        """Leader election on *name*: ``async with election.campaign() as term:`` leads.

        Leadership is a fenced lock on *name* kept by the watchdog; the term is its fencing
        token. *owner* labels this candidate (``election.leader()`` shows it). *max_hold*
        (default: the Redlock's) bounds how long one leader may lead.
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"election name must be str or bytes, got {type(name).__name__}")
        overrides = _given(ttl=ttl, max_hold=max_hold)
        # Fenced (the term); with queue=True, candidates wait in the nodes' grant queue as any lock's waiters.
        settings = self._cluster.lease_settings(self.settings, fencing=True, auto_extend=True, **overrides)
        return Election(self._cluster, name, settings, owner, self._leader_of)

    def synchronized(
        self,
        name: str,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        on_busy: OnBusy = "raise",
        **options: Any,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an ``async def`` function to run under lock *name*: a template filled with the call's
        arguments by parameter name (``"report:{customer_id}"``).

        *blocking* and *timeout* as for ``acquire()``. When the lock is held elsewhere,
        ``on_busy="raise"`` raises :class:`LockNotAcquired`, ``"skip"`` returns None without running;
        when too few nodes could vote, :class:`NodesUnavailable` is raised either way.
        *options* are :meth:`lock`'s (``ttl``, ``cooldown``, ``fencing``, ``owner``, ...).
        """
        busy, limit = check_call(on_busy, blocking, timeout)
        self.lock("synchronized", acquire_timeout=limit, **options)  # bad options raise now
        return decorate_async(name, busy, lambda resource: self.lock(resource, acquire_timeout=limit, **options))


def check_cooldown(settings: Settings, cooldown: object) -> None:
    """A cooldown is a ttl the keys are kept for: checked as one now. It is no lease for the restart
    quarantine (which would otherwise sit a restarted node out for the whole period: docs/guide.md)."""
    try:
        dataclasses.replace(settings, ttl=check_duration("cooldown", cooldown))
    except ValueError as exc:
        raise ValueError(f"cooldown={cooldown!r} s cannot be a lease: {exc}") from None


def _given(**overrides: Any) -> dict[str, Any]:
    """The settings a maker was given (None: the Redlock's)."""
    return {key: value for key, value in overrides.items() if value is not None}
