"""The blocking ``Redlock`` and ``Election``: fronts over the async ones, run on the background loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Self, TypeVar, Unpack, final, overload

from redis.asyncio import Redis

from redlock_async._core import (
    ElectionOptions,
    LeaseOptions,
    LockOptions,
    Settings,
    check_options,
    keyword_timeout,
)
from redlock_async._synchronized import OnBusy, check_call, decorate_sync
from redlock_async.client import Redlock as AsyncRedlock
from redlock_async.election import Election as AsyncElection
from redlock_async.events import OnEvent, as_hook
from redlock_async.inspection import LockInfo
from redlock_async.lock import Lock as AsyncLock
from redlock_async.rwlock import ReadWriteLock as AsyncReadWriteLock
from redlock_async.statistics import RedlockStatistics
from redlock_async.sync._hold import Holding
from redlock_async.sync._lock import Lock
from redlock_async.sync._reentrant import ReentrantLock, ThreadHolds
from redlock_async.sync._runtime import Runtime
from redlock_async.sync._rw import ReadWriteLock

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@final
class Redlock:
    """The blocking twin of :class:`redlock_async.Redlock`, for threads, Celery and Django workers and scripts.

    Takes the same arguments (nodes, ``on_event`` and the settings). Its locks run on one
    background event loop thread per process, shared by every blocking Redlock of the process:
    started on first use, stopped when the last one is closed. Use it as ``with Redlock([...]) as
    redlock:``, or call :meth:`close` when done. After a fork (Celery's prefork pool, gunicorn's
    sync workers), the child's first use starts the child's own loop and connections; the
    parent's are never touched there. Calling it from a thread that runs an event loop raises
    RuntimeError: async code uses the async API.
    """

    __slots__ = ("__weakref__", "_holds", "_runtime")

    def __init__(
        self, nodes: Iterable[str | Redis], *, on_event: OnEvent | Sequence[OnEvent] | None = None, **settings: Any
    ) -> None:
        listed = nodes if isinstance(nodes, (str, bytes)) else list(nodes)  # kept: a forked child makes its own
        hook = as_hook(on_event)  # checked here, not at first use
        self._runtime = Runtime(functools.partial(AsyncRedlock, listed, on_event=hook, **settings))
        self._holds = ThreadHolds()  # the holds of its reentrant locks, by name and thread

    def __repr__(self) -> str:
        twin = self._runtime.current()
        return f"<redlock_async.sync.Redlock nodes={list(twin.nodes)} ttl={twin.settings.ttl}>"

    @property
    def settings(self) -> Settings:
        """The settings in force (a :class:`redlock_async.Settings`)."""
        return self._runtime.current().settings

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses (host:port or unix path; never a password)."""
        return self._runtime.current().nodes

    @property
    def quorum(self) -> int:
        """How many nodes must agree: a strict majority."""
        return self._runtime.current().quorum

    # -- locks ---------------------------------------------------------------------------------------

    # Three overloads that differ in reentrant alone, side by side.
    # fmt: off
    @overload
    def lock(self, name: str | bytes, *, cooldown: float | None = None, interrupt_main: bool = False,
             reentrant: Literal[False] = False, **options: Unpack[LockOptions]) -> Lock: ...
    @overload
    def lock(self, name: str | bytes, *, cooldown: float | None = None, interrupt_main: bool = False,
             reentrant: Literal[True], **options: Unpack[LockOptions]) -> ReentrantLock: ...
    @overload
    def lock(self, name: str | bytes, *, cooldown: float | None = None, interrupt_main: bool = False,
             reentrant: bool, **options: Unpack[LockOptions]) -> Lock | ReentrantLock: ...
    # fmt: on

    def lock(
        self,
        name: str | bytes,
        *,
        cooldown: float | None = None,
        interrupt_main: bool = False,
        reentrant: bool = False,
        **options: Unpack[LockOptions],
    ) -> Lock | ReentrantLock:
        """A :class:`Lock` on *name*; settings left as None are the Redlock's (as the async ``lock()``).

        *cooldown* (seconds): release keeps the keys for that long (at most once per period).
        *interrupt_main*: a lost lease raises LockLost in the main thread's body at once (the lock
        must be acquired in the main thread).
        *reentrant*: a :class:`ReentrantLock`, which the thread holding the name (through a reentrant
        lock of this Redlock) enters again at once; the key is released at the outermost exit. Other
        threads wait as for any lock.
        """
        check_options("lock", options, LockOptions)
        if not isinstance(reentrant, bool):
            raise TypeError(f"reentrant must be True or False, got {type(reentrant).__name__}")

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return twin.lock(name, cooldown=cooldown, **timed(options, timeout))

        lock = Lock(self._runtime, name, make, interrupt_main=interrupt_main)
        return ReentrantLock(lock, self._holds) if reentrant else lock

    def lock_many(
        self,
        names: Iterable[str | bytes],
        *,
        interrupt_main: bool = False,
        **options: Unpack[LockOptions],
    ) -> Lock:
        """A :class:`Lock` on every one of *names* at once, all or none (as the async ``lock_many()``)."""
        check_options("lock_many", options, LockOptions)
        listed = names if isinstance(names, (str, bytes)) else list(names)

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return twin.lock_many(listed, **timed(options, timeout))

        return Lock(self._runtime, tuple(listed), make, interrupt_main=interrupt_main)

    def semaphore(
        self,
        name: str | bytes,
        *,
        limit: int,
        interrupt_main: bool = False,
        **options: Unpack[LeaseOptions],
    ) -> Lock:
        """At most *limit* holders of *name* at once, each holding one permit (as the async ``semaphore()``)."""
        check_options("semaphore", options, LeaseOptions)

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncLock:
            return twin.semaphore(name, limit=limit, **timed(options, timeout))

        return Lock(self._runtime, name, make, interrupt_main=interrupt_main)

    def rw_lock(
        self,
        name: str | bytes,
        *,
        interrupt_main: bool = False,
        **options: Unpack[LockOptions],
    ) -> ReadWriteLock:
        """A read/write lock on *name* (as the async ``rw_lock()``): ``with rw.read():`` and
        ``with rw.write() as writer:`` (and ``with writer.downgrade():``)."""
        check_options("rw_lock", options, LockOptions)

        def make(twin: AsyncRedlock, timeout: float | None) -> AsyncReadWriteLock:
            return twin.rw_lock(name, **timed(options, timeout))

        return ReadWriteLock(self._runtime, name, make, interrupt_main=interrupt_main)

    def election(self, name: str | bytes, **options: Unpack[ElectionOptions]) -> Election:
        """Leader election on *name*: ``with election.campaign() as term:`` leads (as the async ``election()``)."""
        check_options("election", options, ElectionOptions)
        runtime = self._runtime

        def make(twin: AsyncRedlock) -> AsyncElection:
            return twin.election(name, **options)

        return Election(runtime, name, make)

    def synchronized(
        self,
        name: str,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        on_busy: OnBusy = "raise",
        **options: Any,
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """Decorate a function to run under lock *name*: a template filled with the call's arguments by
        parameter name (``"report:{customer_id}"``).

        *blocking* and *timeout* as for ``acquire()``. When the lock is held elsewhere,
        ``on_busy="raise"`` raises :class:`LockNotAcquired`, ``"skip"`` returns None without running;
        when too few nodes could vote, :class:`NodesUnavailable` is raised either way.
        *options* are :meth:`lock`'s (``ttl``, ``cooldown``, ``fencing``, ``interrupt_main``, ...).
        """
        busy, limit = check_call(on_busy, blocking, timeout)
        self.lock("synchronized", acquire_timeout=limit, **options)  # bad options raise now
        return decorate_sync(name, busy, lambda resource: self.lock(resource, acquire_timeout=limit, **options))

    # -- reads -----------------------------------------------------------------------------------------

    def inspect(self, name: str | bytes) -> LockInfo:
        """Who holds lock *name*, for how long, and whether that is certain (reads only; as the async ``inspect()``)."""
        twin = self._runtime.current()
        return self._runtime.call(lambda: twin.inspect(name))

    def statistics(self) -> RedlockStatistics:
        """A snapshot of the nodes' connections, the locks held and the watchdog; reads no node."""
        twin = self._runtime.current()

        async def read() -> RedlockStatistics:
            return twin.statistics()

        return self._runtime.call(read)

    # -- open and close --------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to every node now rather than on first use (as the async ``connect()``)."""
        twin = self._runtime.current()
        self._runtime.call(twin.connect)

    def close(self) -> None:
        """Close this Redlock's connections; locks it still holds are released and their holders told LockLost.

        The background loop thread stops when the last blocking Redlock of the process is closed. Idempotent.
        """
        self._runtime.close()

    def __enter__(self) -> Self:
        try:
            self.connect()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@final
class Election:
    """The blocking twin of :class:`redlock_async.Election`: campaign for, resign from and observe one leadership."""

    __slots__ = ("_generation", "_holding", "_make", "_runtime", "name")

    def __init__(self, runtime: Runtime, name: str | bytes, make: Callable[[AsyncRedlock], AsyncElection]) -> None:
        self._runtime = runtime
        self._make = make
        self.name = name
        make(runtime.current())  # bad input raises now
        self._generation = runtime.generation
        self._holding: Holding[int] = Holding()

    def _fresh(self) -> Holding[int]:
        """The holding of this process (a forked child's campaign is its own, not the parent's)."""
        self._runtime.current()
        if self._runtime.generation != self._generation:
            self._generation = self._runtime.generation
            self._holding = Holding()
        return self._holding

    def __repr__(self) -> str:
        return f"<redlock_async.sync.Election {self.name!r}>"

    @property
    def lost(self) -> threading.Event:
        """A ``threading.Event`` set when the current term's leadership is lost."""
        return self._fresh().lost

    if TYPE_CHECKING:  # type checkers see timeout keyword-only; a positional one works, warned, until 0.3.0

        def campaign(self, *, timeout: float | None = None) -> AbstractContextManager[int]: ...

    else:

        def campaign(self, *positional: float | None, timeout: float | None = None) -> AbstractContextManager[int]:
            """Wait until this candidate leads (no time limit by default), then yield its term.

            Leaving the block resigns. If leadership is lost meanwhile, :attr:`lost` is set and leaving
            the block raises ``LockLost``. With *timeout*, ``LockNotAcquired`` when another led throughout.
            *timeout* is keyword-only (``campaign(5)`` still works in this release, with a ``DeprecationWarning``).
            """
            return self._campaign(keyword_timeout("campaign", positional, timeout))

    @contextlib.contextmanager
    def _campaign(self, timeout: float | None) -> Iterator[int]:
        runtime = self._runtime
        portal = runtime.portal()
        holding = self._fresh()
        user = holding.claim()
        if user is not None:
            if user is not threading.current_thread():
                raise RuntimeError(
                    f"election {self.name!r} is campaigning in another thread ({user.name}) through this same "
                    "Election object: make one per thread"
                )
            # Nested in this thread's own campaign: as any campaign of the name, NestedAcquire while it leads.
            holding = Holding()
            holding.claim()
        try:
            election = self._make(runtime.current())
        except BaseException:
            holding.unclaim()
            raise
        term = holding.enter(portal, lambda: election.campaign(timeout=timeout), runtime.holders)
        try:
            yield term
        except BaseException as exc:
            try:
                holding.leave(runtime.portal)
            except Exception as problem:  # never masks what the body raised
                if problem is not exc:
                    log.warning("redlock election %r: %s (while the body raised %r)", self.name, problem, exc)
            raise
        holding.leave(runtime.portal)

    def leader(self) -> LockInfo:
        """The current leader as the nodes say (``state``, ``owner``, and the term as ``fencing_counter``)."""
        election = self._make(self._runtime.current())
        return self._runtime.call(election.leader)

    def observe(self) -> Generator[LockInfo, None, None]:
        """The current leader first (if any), then each new leader, in order (blocks between them)."""
        runtime = self._runtime
        election = self._make(runtime.current())
        leaders = election.observe()

        async def next_leader() -> LockInfo:
            return await anext(leaders)

        async def stop() -> None:
            await leaders.aclose()

        try:
            while True:
                try:
                    yield runtime.call(next_leader)
                except StopAsyncIteration:
                    return
        finally:
            if not runtime.closed:
                runtime.call(stop)


def loop_of(redlock: Redlock) -> asyncio.AbstractEventLoop:
    """The event loop *redlock*'s locks run on, in its background thread (for ``redlock_async.testing``)."""
    return redlock._runtime.portal().loop


Options = TypeVar("Options", LeaseOptions, LockOptions)


def timed(options: Options, timeout: float | None) -> Options:
    """*options* for the async maker, with the acquire timeout of this call when it has one (the blocking
    ``acquire(timeout=)``)."""
    if timeout is None:
        return options
    timed = options.copy()
    timed["acquire_timeout"] = timeout
    return timed
