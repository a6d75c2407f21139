"""``Redlock``: the settings, the lifecycle and inspection of its nodes (whose connections are
``_connections.py``'s); its makers of locks, semaphores and elections are ``_makers.py``'s."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Self, final

from redis.asyncio import Redis

from redlock_async._core import Settings, renamed
from redlock_async._makers import Makers
from redlock_async._shared import Cluster, Connections, keys_of, require_asyncio
from redlock_async.events import OnEvent, as_hook
from redlock_async.inspection import LockInfo
from redlock_async.statistics import RedlockStatistics

_DEFAULTS = Settings()


@final
class Redlock(Makers):
    """A set of independent Redis masters and the settings locks on them share.

    *nodes* are URLs (``redis://``, ``rediss://``, ``unix://``) or
    ``redis.asyncio.Redis`` clients. For each node the Redlock keeps one
    connection of its own, made with the URL's or the client's connection
    settings (TLS, username, password, db). Clients you pass stay yours: the
    Redlock never closes them.

    Use it as ``async with Redlock([...]) as redlock:``, or call
    :meth:`aclose` when done.

    The keyword arguments are the settings (see ``Settings`` in
    ``redlock_async._core._settings`` and the README's table), and *on_event*: a
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
        wait_replicas: int | None = _DEFAULTS.wait_replicas,
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
            wait_replicas=wait_replicas,
        )
        connections = self._connections = Connections(nodes, self.settings, as_hook(on_event))
        self._nodes = connections.nodes
        super().__init__(self.settings, connections.cluster, self._inspect_lock)

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

    async def inspect(self, name: str | bytes) -> LockInfo:
        """Who holds lock *name* (its owner label), for how long, and whether that is certain; and the
        permits held of semaphore *name*, if one was used (``limit``, ``permits``).

        Reads only, through connections of its own that write nothing (no script, no
        restart-quarantine marker, no PUBLISH), opened on the first call and kept until the
        Redlock closes. The verdict follows the majority rule: ``"held"`` when one holder has
        a majority (of the lock, or of a permit), ``"free"`` when a majority answered and no one
        could have one, otherwise ``"unknown"``. A node that may have lost keys (in restart
        quarantine, or its clock jumped ahead) rules no holder out, but a holder it shows counts:
        a verdict is never wrong, at worst unknown. Never shows a token.
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"lock name must be str or bytes, got {type(name).__name__}")
        self._connections.cluster.check_open()
        return await self._connections.inspector.inspect(
            keys_of(self.settings, name, one_slot=self._connections.cluster.one_slot)
        )

    async def _inspect_lock(self, name: str | bytes) -> LockInfo:
        """:meth:`inspect` of the lock alone (an election's leader: a semaphore of its name is another thing)."""
        self._connections.cluster.check_open()
        return await self._connections.inspector.inspect(
            keys_of(self.settings, name, semaphore=False, one_slot=self._connections.cluster.one_slot)
        )

    def statistics(self) -> RedlockStatistics:
        """A snapshot of the nodes' connections, the locks held and watched, the watchdog and the waiters.

        Reads no node (nothing is sent): a few attribute reads per node and per lock held.
        """
        return self._connections.statistics()

    async def connect(self) -> None:
        """Connect to every node now rather than on first use; a node that fails is logged and retried later.

        Raises :class:`RedlockError` when so many nodes refuse a command the lock scripts run (an ACL
        user without ``+@scripting`` or one the scripts call, such as ``PEXPIRE``; a renamed EVALSHA) that
        no majority could release or extend a lock: each connect runs a probe script calling every one.
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


def _max_unanswered(value: int, old: int | None) -> int:
    """``max_unanswered``, or the deprecated ``max_queued=`` when given (with a warning)."""
    if old is None:
        return value
    renamed("Redlock(max_queued=)", "Redlock(max_unanswered=)", stacklevel=4)
    return old


def cluster_of(redlock: Redlock) -> Cluster:
    """What the locks of *redlock* share, its nodes among it (for ``redlock_async.testing``); reads no node."""
    return redlock._connections.cluster
