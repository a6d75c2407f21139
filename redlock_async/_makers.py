"""The makers of a Redlock's primitives: ``lock`` (reentrant too), ``lock_many``, ``semaphore``, ``rw_lock``,
``election`` and the ``synchronized`` decorator, each from the Redlock's settings and the names it was given.

A base of :class:`redlock_async.Redlock` (as redis-py's clients take their commands from mixins): the
Redlock is the set of nodes and their lifecycle; this is what it makes on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, ParamSpec, TypeAlias, TypeVar, Unpack, overload

from redlock_async._core import (
    ElectionOptions,
    LeaseOptions,
    LockOptions,
    Reentries,
    Settings,
    canonical_names,
    check_duration,
    check_options,
    overrides,
)
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
OnLost: TypeAlias = "Callable[[LockLost], object] | None"
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

    # Three overloads that differ in reentrant alone, side by side.
    # fmt: off
    @overload
    def lock(self, name: str | bytes, *, on_lost: OnLost = None, cooldown: float | None = None,
             reentrant: Literal[False] = False, **options: Unpack[LockOptions]) -> Lock: ...
    @overload
    def lock(self, name: str | bytes, *, on_lost: OnLost = None, cooldown: float | None = None,
             reentrant: Literal[True], **options: Unpack[LockOptions]) -> ReentrantLock: ...
    @overload
    def lock(self, name: str | bytes, *, on_lost: OnLost = None, cooldown: float | None = None,
             reentrant: bool, **options: Unpack[LockOptions]) -> Lock | ReentrantLock: ...
    # fmt: on

    def lock(
        self,
        name: str | bytes,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        cooldown: float | None = None,
        reentrant: bool = False,
        **options: Unpack[LockOptions],
    ) -> Lock | ReentrantLock:
        """A Lock on resource *name*.

        *options* are settings for this lock: ``ttl``, ``acquire_timeout``, ``fencing``, ``auto_extend``,
        ``max_hold``, ``max_extensions`` (left out or None: the Redlock's), and ``owner``.

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
        check_options("lock", options, LockOptions)
        if not isinstance(reentrant, bool):
            raise TypeError(f"reentrant must be True or False, got {type(reentrant).__name__}")
        if not isinstance(name, (str, bytes)):
            raise TypeError(
                f"resource name must be str or bytes, got {type(name).__name__}: for several names, use lock_many()"
            )
        settings = self._cluster.lease_settings(self.settings, **overrides(options))
        if cooldown is not None:
            check_cooldown(settings, cooldown)
        lock = Lock(self._cluster, name, settings, on_lost=on_lost, owner=options.get("owner"), cooldown=cooldown)
        return ReentrantLock(lock, self._reentries) if reentrant else lock

    def lock_many(
        self,
        names: Iterable[str | bytes],
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        **options: Unpack[LockOptions],
    ) -> Lock:
        """A Lock on every one of *names* at once: each node sets all of them or none, and the
        lock is held when a majority did. *options* as for :meth:`lock`.

        Its keys are the ones single locks use, so ``lock("a")`` and ``lock_many(["a", "b"])``
        exclude each other. The names are deduplicated and taken in one order on every client
        (sorted by their bytes: :attr:`Lock.names`), so opposite orders cannot deadlock. The
        watchdog extends them together; losing any is losing the lock, and every name is released.
        """
        check_options("lock_many", options, LockOptions)
        canonical = canonical_names(names)
        settings = self._cluster.lease_settings(self.settings, **overrides(options))
        name = canonical if len(canonical) > 1 else canonical[0]
        return Lock(self._cluster, name, settings, on_lost=on_lost, owner=options.get("owner"))

    def semaphore(
        self,
        name: str | bytes,
        *,
        limit: int,
        on_lost: Callable[[LockLost], object] | None = None,
        **options: Unpack[LeaseOptions],
    ) -> Semaphore:
        """A semaphore: at most *limit* holders of *name* at once, each holding one permit.

        Each permit is a lock of its own (one of *limit* slots), so the bound holds whenever
        single locks are safe. Every client of one semaphore must use the same *limit*: a
        different one, while a permit is held, is a ValueError at acquire. Not fenced. *options* as for
        :meth:`lock`, without ``fencing``.
        """
        check_options("semaphore", options, LeaseOptions)
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"semaphore name must be str or bytes, got {type(name).__name__}")
        check_limit(limit)
        settings = self._cluster.lease_settings(self.settings, fencing=False, **overrides(options))
        return Semaphore(self._cluster, name, limit, settings, on_lost=on_lost, owner=options.get("owner"))

    def rw_lock(
        self,
        name: str | bytes,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        **options: Unpack[LockOptions],
    ) -> ReadWriteLock:
        """A read/write lock on *name*: ``async with rw.read():`` holds together with other readers,
        ``async with rw.write():`` alone. *options* as for :meth:`lock`.

        Every reader has a lease of its own (a crashed reader frees only its share, within its ttl); a
        writer that waits keeps new readers out; a writer may downgrade to a reader without a gap. Its
        keys are its own: ``lock(name)`` and ``rw_lock(name)`` do not exclude each other. With
        *fencing*, a writer gets a fencing token as a lock does, and a reader the last writer's
        (docs/guide.md, "Many readers or one writer").
        """
        check_options("rw_lock", options, LockOptions)
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"read/write lock name must be str or bytes, got {type(name).__name__}")
        settings = self._cluster.lease_settings(self.settings, **overrides(options))
        return ReadWriteLock(self._cluster, name, settings, on_lost=on_lost, owner=options.get("owner"))

    def election(self, name: str | bytes, **options: Unpack[ElectionOptions]) -> Election:
        """Leader election on *name*: ``async with election.campaign() as term:`` leads.

        Leadership is a fenced lock on *name* kept by the watchdog; the term is its fencing
        token. *owner* labels this candidate (``election.leader()`` shows it). *max_hold*
        (default: the Redlock's) bounds how long one leader may lead.
        """
        check_options("election", options, ElectionOptions)
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"election name must be str or bytes, got {type(name).__name__}")
        # Fenced (the term); with queue=True, candidates wait in the nodes' grant queue as any lock's waiters.
        settings = self._cluster.lease_settings(self.settings, fencing=True, auto_extend=True, **overrides(options))
        return Election(self._cluster, name, settings, options.get("owner"), self._leader_of)

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
