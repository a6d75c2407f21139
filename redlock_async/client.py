"""``Redlock``: the settings, and the makers of locks, semaphores and elections on its nodes
(whose connections are ``_connections.py``'s)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Literal, ParamSpec, Self, TypeVar, final, overload

from redis.asyncio import Redis

from redlock_async._cluster import require_asyncio
from redlock_async._connections import Connections
from redlock_async._deprecated import renamed
from redlock_async._inspect import keys_of
from redlock_async._names import canonical_names
from redlock_async._reentry import Reentries
from redlock_async._settings import Settings, check_duration
from redlock_async._synchronized import OnBusy, check_call, decorate_async
from redlock_async.election import Election
from redlock_async.errors import LockLost
from redlock_async.events import OnEvent, as_hook
from redlock_async.inspection import LockInfo
from redlock_async.lock import Lock
from redlock_async.reentrant import ReentrantLock
from redlock_async.rwlock import ReadWriteLock
from redlock_async.semaphore import Semaphore, check_limit
from redlock_async.statistics import RedlockStatistics

_DEFAULTS = Settings()

P = ParamSpec("P")
R = TypeVar("R")


@final
class Redlock:
    """A set of independent Redis masters and the settings locks on them share.

    *nodes* are URLs (``redis://``, ``rediss://``, ``unix://``) or
    ``redis.asyncio.Redis`` clients. For each node the Redlock keeps one
    connection of its own, made with the URL's or the client's connection
    settings (TLS, username, password, db). Clients you pass stay yours: the
    Redlock never closes them.

    Use it as ``async with Redlock([...]) as redlock:``, or call
    :meth:`aclose` when done.

    The keyword arguments are the settings (see ``Settings`` in
    ``redlock_async._settings`` and the README's table), and *on_event*: a
    function called with a :class:`redlock_async.events.LockEvent` for every
    acquire, extension, release and loss, for metrics (or a sequence of them,
    each called in turn; :mod:`redlock_async.metrics` has ready-made ones).
    """

    def __init__(
        self,
        nodes: Iterable[str | Redis],
        *,
        ttl: float = _DEFAULTS.ttl,
        node_timeout: float = _DEFAULTS.node_timeout,
        adaptive_timeout: bool = _DEFAULTS.adaptive_timeout,
        drift_factor: float = _DEFAULTS.drift_factor,
        retry_delay: float = _DEFAULTS.retry_delay,
        acquire_timeout: float = _DEFAULTS.acquire_timeout,
        connect_timeout: float = _DEFAULTS.connect_timeout,
        reconnect_delay: float = _DEFAULTS.reconnect_delay,
        max_unanswered: int = _DEFAULTS.max_unanswered,
        max_queued: int | None = None,
        key_prefix: str = _DEFAULTS.key_prefix,
        wait_for_release: bool = _DEFAULTS.wait_for_release,
        queue: bool | None = None,
        fencing: bool = _DEFAULTS.fencing,
        fence_prefix: str = _DEFAULTS.fence_prefix,
        fence_ttl: float | None = _DEFAULTS.fence_ttl,
        auto_extend: bool = _DEFAULTS.auto_extend,
        extend_threshold: float = _DEFAULTS.extend_threshold,
        max_hold: float = _DEFAULTS.max_hold,
        max_extensions: int | None = _DEFAULTS.max_extensions,
        restart_quarantine: float | None = _DEFAULTS.restart_quarantine,
        clock_guard: bool = _DEFAULTS.clock_guard,
        on_event: OnEvent | Sequence[OnEvent] | None = None,
    ) -> None:
        self.settings = Settings(
            ttl=ttl,
            node_timeout=node_timeout,
            adaptive_timeout=adaptive_timeout,
            drift_factor=drift_factor,
            retry_delay=retry_delay,
            acquire_timeout=acquire_timeout,
            connect_timeout=connect_timeout,
            reconnect_delay=reconnect_delay,
            max_unanswered=_max_unanswered(max_unanswered, max_queued),
            key_prefix=key_prefix,
            wait_for_release=wait_for_release,
            queue=queue,
            fencing=fencing,
            fence_prefix=fence_prefix,
            fence_ttl=fence_ttl,
            auto_extend=auto_extend,
            extend_threshold=extend_threshold,
            max_hold=max_hold,
            max_extensions=max_extensions,
            restart_quarantine=restart_quarantine,
            clock_guard=clock_guard,
        )
        connections = self._connections = Connections(nodes, self.settings, as_hook(on_event))
        self._nodes = connections.nodes
        self._cluster = connections.cluster
        self._reentries = Reentries()  # the holds of its reentrant locks, by name and task

    def __repr__(self) -> str:
        return f"<redlock_async.Redlock nodes={list(self.nodes)} ttl={self.settings.ttl}>"

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses (host:port or unix path; never a password)."""
        return tuple(node.name for node in self._nodes)

    @property
    def quorum(self) -> int:
        """How many nodes must agree: a strict majority."""
        return self._connections.quorum

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
        settings = self._cluster.lease_settings(self.settings, queue=False, **overrides)
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
        return Election(self._cluster, name, settings, owner, self._inspect_lock)

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

    async def inspect(self, name: str | bytes) -> LockInfo:
        """Who holds lock *name* (its owner label), for how long, and whether that is certain; and the
        permits held of semaphore *name*, if one was used (``limit``, ``permits``).

        Reads only, through connections of its own that write nothing (no script, no
        restart-quarantine marker, no PUBLISH), opened on the first call and kept until the
        Redlock closes. The verdict follows the majority rule: ``"held"`` when one holder has
        a majority (of the lock, or of a permit), ``"free"`` when a majority answered and no one
        could have one, otherwise ``"unknown"``. A node in restart quarantine counts as one that
        did not answer. Never shows a token.
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"lock name must be str or bytes, got {type(name).__name__}")
        self._cluster.check_open()
        return await self._connections.inspector.inspect(keys_of(self.settings, name))

    async def _inspect_lock(self, name: str | bytes) -> LockInfo:
        """:meth:`inspect` of the lock alone (an election's leader: a semaphore of its name is another thing)."""
        self._cluster.check_open()
        return await self._connections.inspector.inspect(keys_of(self.settings, name, semaphore=False))

    def statistics(self) -> RedlockStatistics:
        """A snapshot of the nodes' connections, the locks held and watched, the watchdog and the waiters.

        Reads no node (nothing is sent): a few attribute reads per node and per lock held.
        """
        return self._connections.statistics()

    async def connect(self) -> None:
        """Connect to every node now rather than on first use; a node that fails is logged and retried later.

        Raises :class:`RedlockError` when so many nodes answer the Lua scripts with an error (an ACL
        user without ``+@scripting``, a renamed EVALSHA) that no majority could release or extend a lock.
        """
        await self._connections.connect()

    async def aclose(self) -> None:
        """Close the Redlock's own connections, after queued releases went out. Idempotent.

        A cancellation cannot cut it short (anyio cancels again at every await):
        the connections and tasks are closed all the same, then the
        cancellation goes on.
        """
        await self._connections.aclose()

    async def __aenter__(self) -> Self:
        require_asyncio()
        try:
            await self.connect()
        except BaseException:
            await self.aclose()  # __aexit__ will not run: leave no task or connection behind
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


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


def _max_unanswered(value: int, old: int | None) -> int:
    """``max_unanswered``, or the deprecated ``max_queued=`` when given (with a warning)."""
    if old is None:
        return value
    renamed("Redlock(max_queued=)", "Redlock(max_unanswered=)", stacklevel=4)
    return old
