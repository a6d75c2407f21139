"""What every lock of one Redlock shares, and the one place that says whether locks may be taken.

A ``Lock`` asks its ``Cluster`` (never the ``Redlock``) for the nodes, the watchdog, the
waiters' listener and the events hook; it tells it which locks it holds and which ttls it
grants, so that the default restart quarantine covers them. ``Redlock`` is the public face
that builds one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from redlock_async._core import ClockFault, Settings, drift, resource_key
from redlock_async._health import ClockGuard
from redlock_async._nodes import ClusterVoter, Node, Receiver, key_slot
from redlock_async._shared._handoff import Listener
from redlock_async._shared._watchdog import Watchdog
from redlock_async.errors import RedlockError
from redlock_async.events import EventKind, LockEvent, OnEvent

log = logging.getLogger("redlock_async")

TRIO_REFUSED = (
    "redlock_async runs on asyncio only (asyncio.run, uvloop, anyio's asyncio backend as FastAPI and Starlette use), "
    "not on trio: run it with anyio.run(main, backend='asyncio')"
)


class Watched(Protocol):
    watched: bool


class Kept(Protocol):
    """A held lock as its Redlock keeps it (``Cluster.held``): its keeper, which the Redlock and its Cluster
    tell what happened."""

    name: object
    """The name (or names) it holds, for messages."""

    @property
    def held(self) -> bool:
        """Held now, validity left."""

    @property
    def tenure(self) -> Watched:
        """Its life: whether the watchdog keeps it now."""

    def watchdog_failed(self, exc: BaseException) -> None:
        """The watchdog's task failed unexpectedly: a watched lease can no longer be kept."""

    def redlock_closed(self, why: str) -> None:
        """The Redlock closes while the lock is held: release it, and tell its holder it is lost."""

    def node_lost(self, node: int, why: str) -> None:
        """Node *node* (an index into the Redlock's nodes) may have lost the lock's key (its clock jumped
        ahead): count it as lost now, and lose the lock when fewer than a majority may still hold it."""


class Cluster:
    """The nodes of one Redlock and what its locks share: watchdog, listener, held locks, events hook."""

    __slots__ = (
        "_loop",
        "_max_ttl",
        "_pauses",
        "bound",
        "clock",
        "closed",
        "fault",
        "first_use",
        "held",
        "listener",
        "names",
        "nodes",
        "on_event",
        "one_slot",
        "settings",
        "watchdog",
    )

    def __init__(
        self,
        nodes: tuple[Node, ...],
        settings: Settings,
        listener: Listener,
        on_event: OnEvent | None,
    ) -> None:
        self.nodes = nodes
        self.names = tuple(node.name for node in nodes)
        """The nodes' names (``host:port``), for events."""
        self.settings = settings
        self.listener = listener
        self.on_event = on_event
        self.one_slot = False
        """The one-slot key layout (``_names.one_slot_voters``: a voter is a cluster): a fencing counter
        and a read/write lock's companions in the slot of the key they serve; False: their names of every
        version before. Read when a lock is made."""
        self.watchdog = Watchdog(nodes, settings.node_timeout, on_fault=self.watchdog_failed)
        self.watchdog.reading = self.reading
        self.held: weakref.WeakSet[Kept] = weakref.WeakSet()
        """Locks held now: given up when the Redlock closes."""
        self.bound: dict[bytes, list[object]] = {}
        """Which holder (a task; for the blocking API, a thread: ``_holder``) holds which key inside ``async
        with`` (one entry per hold; a semaphore's key can have several): a nested acquire of a key its own
        holder holds fails at once (:meth:`held_by`)."""
        self.clock: ClockGuard | None = None
        """The clock guard (``clock_guard=True``, the default), set by the Redlock once its nodes are made."""
        self.closed = False
        self.first_use: Callable[[], Awaitable[None]] | None = None
        """Awaited by an acquire while set: the checks of ``connect()`` (the permissions probe) when the user
        never called it; unset once they passed (set by the Redlock's connections)."""
        self.fault: BaseException | None = None
        """A background task's unexpected exception: every later call says so."""
        self._max_ttl = 0.0  # the largest ttl of the locks made so far (0: none yet)
        self._pauses: set[asyncio.Future[None]] = set()  # acquires sleeping between attempts
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of its first call: its nodes' loop

    def check_open(self) -> None:
        """Raise unless locks can be taken: an asyncio loop runs (the Redlock's), the Redlock is open and no
        task of it failed."""
        loop = require_asyncio()
        if self._loop is not loop:
            if self._loop is not None:
                raise RuntimeError(
                    "this Redlock is bound to another event loop: make the Redlock inside the loop that uses it"
                )
            self._loop = loop
        if self.fault is not None:
            raise RedlockError(
                f"redlock_async stopped on an internal error ({describe(self.fault)}; its traceback is in the "
                "log): make a new Redlock",
                name="",
            ) from self.fault
        if self.closed:
            raise RuntimeError("this Redlock is closed: make a new one")

    def lease_settings(self, base: Settings, **overrides: Any) -> Settings:
        """*base* with *overrides* (checked by Settings): the one way a lock's settings, and so a ttl, come
        to be. Every ttl that may be granted passes here, so the default restart quarantine covers it."""
        settings = dataclasses.replace(base, **overrides) if overrides else base
        if settings.ttl > self._max_ttl:
            self._max_ttl = settings.ttl
        return settings

    def quarantine_period(self) -> float:
        """Seconds a restarted node sits out: the setting, or the largest ttl in use plus its drift.

        Before the first lock is made, the Redlock's own ttl stands for the ttls to come.
        """
        configured = self.settings.restart_quarantine
        if configured is not None:
            return configured
        return self.longest_lease()

    def longest_lease(self) -> float:
        """The largest ttl in use plus its drift: after this long, every lease granted before now ran out
        (a node whose clock jumped ahead sits out this long). The Redlock's ttl before the first lock."""
        ttl = self._max_ttl or self.settings.ttl
        return ttl + drift(ttl, self.settings.drift_factor)

    def reading(self) -> Receiver | None:
        """The receiver of the clock guard's ``TIME`` for one request about to be sent; None without guard."""
        clock = self.clock
        return None if clock is None else clock.reading()

    def clock_fault(self, i: int, fault: ClockFault, size: float, words: str) -> None:
        """The clock guard saw node *i*'s clock fault (a new episode; it warned): an event, and a node
        found ahead is lost at once to every lock that counted it."""
        if fault is ClockFault.AHEAD:
            for lock in list(self.held):
                lock.node_lost(i, words)
        self._tell(
            LockEvent(
                EventKind.CLOCK, "", reason=words, clock_fault=fault.value, clock_jump=size, nodes=(self.names[i],)
            )
        )

    def evicted(self, i: int, words: str, new: bool) -> None:
        """Node *i* evicted keys (``_evictions``; it sits out a period): lost to every lock that counted it,
        and, for a *new* episode, an event."""
        for lock in list(self.held):
            lock.node_lost(i, words)
        if new:
            self._tell(LockEvent(EventKind.EVICTED, "", reason=words, nodes=(self.names[i],)))

    def shard_replaced(self, i: int, shard: Node, why: str) -> None:
        """A shard of Cluster voter *i* sits out because its primary changed (``_health/_shards.py``): lost at
        once to every lock whose name it serves (or whose slot cannot be told)."""
        voter = self.nodes[i]
        owners = voter.owners if isinstance(voter, ClusterVoter) else None
        prefix = self.settings.key_prefix
        for lock in list(self.held):
            names = lock.name if isinstance(lock.name, list | tuple) else (lock.name,)
            try:
                slots = {key_slot(resource_key(prefix, name)) for name in names}
            except (TypeError, ValueError):
                slots = set()
            if owners is None or not slots or any(owners[slot] in (shard, None) for slot in slots):
                lock.node_lost(i, why)

    def shard_clock_fault(self, i: int, shard: Node, fault: ClockFault, size: float, words: str) -> None:
        """A shard primary of Cluster voter *i* whose clock faulted (a new episode; its guard warned): one found
        ahead sits out and is lost at once to every lock whose name it serves; an event."""
        if fault is ClockFault.AHEAD:
            self.shard_replaced(i, shard, words)
        self._tell(
            LockEvent(
                EventKind.CLOCK, "", reason=words, clock_fault=fault.value, clock_jump=size, nodes=(self.names[i],)
            )
        )

    def shard_evicted(self, i: int, shard: Node, words: str, new: bool) -> None:
        """A shard primary of Cluster voter *i* evicted keys (it sits out): lost at once to every lock whose name
        it serves; for a *new* episode, an event."""
        self.shard_replaced(i, shard, words)
        if new:
            self._tell(LockEvent(EventKind.EVICTED, "", reason=words, nodes=(self.names[i],)))

    def _tell(self, event: LockEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("redlock node %s: on_event callback failed", event.nodes[0])

    def failed(self, exc: BaseException) -> None:
        """A background task failed unexpectedly (logged there): every call from now on says so, and
        acquires waiting for their next try look now (they raise), not after their retry delay."""
        if self.fault is None:
            self.fault = exc
            self.wake_waiters()

    def wake_waiters(self) -> None:
        """End every acquire's wait for its next try now (a fault, or the Redlock closing): they look at
        their Redlock at once, and raise."""
        self.listener.interrupt()
        for fut in self._pauses:
            if not fut.done():
                fut.set_result(None)

    async def pause(self, delay: float) -> None:
        """Sleep *delay* seconds between two acquire attempts, or less if this Redlock fails meanwhile."""
        if self.fault is not None:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pauses.add(fut)
        try:
            async with asyncio.timeout(delay):
                await fut
        except TimeoutError:
            pass
        finally:
            self._pauses.discard(fut)

    def bind(self, keys: tuple[bytes, ...], holder: object) -> None:
        """*holder* (a task, or a thread: ``_holder``) holds *keys* inside ``async with`` from now on (until
        :meth:`unbind`)."""
        bound = self.bound
        for key in keys:
            holders = bound.get(key)
            if holders is None:
                bound[key] = [holder]
            else:
                holders.append(holder)

    def unbind(self, keys: tuple[bytes, ...], holder: object) -> None:
        """One hold of *keys* by *holder* ended (released, lost, or its ``async with`` left)."""
        bound = self.bound
        for key in keys:
            holders = bound.get(key)
            if holders is not None and holder in holders:
                holders.remove(holder)
                if not holders:
                    del bound[key]

    def held_by(self, key: bytes, holder: object | None) -> int:
        """How many holds of *key* *holder* has inside ``async with`` (a semaphore's permits: several)."""
        holders = self.bound.get(key)
        return holders.count(holder) if holders and holder is not None else 0

    def watchdog_failed(self, exc: BaseException) -> None:
        """The watchdog's task failed unexpectedly (logged there): no lock it kept can be trusted."""
        self.failed(exc)
        for lock in list(self.held):
            lock.watchdog_failed(exc)


def require_asyncio() -> asyncio.AbstractEventLoop:
    """The running asyncio event loop; a one-line RuntimeError when none runs (trio is named when it is the
    one running)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        trio = sys.modules.get("trio")
        if trio is not None:
            try:
                trio.lowlevel.current_task()
            except RuntimeError:
                pass
            else:
                raise RuntimeError(TRIO_REFUSED) from None
        raise RuntimeError(
            "redlock_async needs a running asyncio event loop: call it from async code run by asyncio.run(), "
            "uvloop or anyio's asyncio backend"
        ) from None


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
