"""``Election``: one leader at a time among the processes that campaign for a name, with terms.

Leadership is a fenced lock on the election's name, held with the watchdog for as long as the
leader's block runs. Its term is the lock's fencing token: larger than every earlier leader's,
so work tagged with it can be fenced (``redlock_async.fenced_set``). A leader that resigns
(leaves the block) releases the lock and the oldest candidate of this process is woken by the
pushed hand-off; one that dies is succeeded once its lease runs out. A leader that cannot keep
its lease (a pause, a partition) has its block cancelled with ``LockLost``, as any lock's body.

Observers need no lease: :meth:`Election.observe` reads the nodes as :meth:`Redlock.inspect`
does (writing nothing), when a new leader announces itself or a release is heard, and at a
bounded pace otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from redlock_async._core import check_duration, check_owner, keyword_timeout, resource_key
from redlock_async._core import holder as _holder
from redlock_async.errors import NestedAcquire
from redlock_async.inspection import LockInfo
from redlock_async.lock import Lock

if TYPE_CHECKING:
    from redlock_async._core import Settings
    from redlock_async._shared import Cluster

LEADER_CHANNEL = b"\x00leader"
"""After the election's key: the channel a new leader announces its term on."""


class Election:
    """Campaign for, resign from and observe the leadership of one name.

    Made by :meth:`Redlock.election`. ``campaign()`` may be entered by one task at a time per
    Election; make one Election per candidate.
    """

    __slots__ = ("_cluster", "_inspect", "_key", "_settings", "name", "owner")

    def __init__(
        self,
        cluster: Cluster,
        name: str | bytes,
        settings: Settings,
        owner: str | None,
        inspect: Callable[[str | bytes], Awaitable[LockInfo]],
    ) -> None:
        self._cluster = cluster
        self._settings = settings
        self._key = resource_key(settings.key_prefix, name)
        self._inspect = inspect
        self.name = name
        """The election's name: its lock's name (``redlock status NAME`` shows the leader)."""
        check_owner(owner)  # now, not at the first campaign
        self.owner = owner
        """This candidate's label, shown as the leader's owner (default: ``<hostname>:<pid>``)."""

    def __repr__(self) -> str:
        return f"<redlock_async.Election {self.name!r}>"

    if TYPE_CHECKING:  # type checkers see timeout keyword-only; a positional one works, warned, until 0.3.0

        def campaign(self, *, timeout: float | None = None) -> AbstractAsyncContextManager[int]: ...

    else:

        def campaign(self, *positional: float | None, timeout: float | None = None) -> AbstractAsyncContextManager[int]:
            """Wait until this candidate leads (no time limit by default), then yield its term.

            The term is larger than every earlier leader's. Leaving the block resigns, and the
            next candidate takes over at once. If leadership is lost meanwhile, the block is
            cancelled and raises ``LockLost``. With *timeout* (seconds), ``LockNotAcquired`` when
            another candidate led the whole time (``NodesUnavailable`` when too few nodes could vote). A
            campaign nested in one of the same election (or in ``async with`` of its lock) in the same task
            raises ``NestedAcquire`` at once.

            *timeout* is keyword-only, as ``Lock.acquire``'s; ``campaign(5)`` still works in this release,
            with a ``DeprecationWarning``.
            """
            return self._campaign(keyword_timeout("campaign", positional, timeout))

    @contextlib.asynccontextmanager
    async def _campaign(self, timeout: float | None) -> AsyncIterator[int]:
        limit = math.inf if timeout is None else check_duration("timeout", timeout, zero_ok=True, inf_ok=True)
        holder = _holder.current()
        if self._cluster.held_by(self._key, holder):
            # Leading already (or holding the lock of the same name): the campaign would wait for itself,
            # with no timeout for ever.
            words = _holder.described(holder)
            raise NestedAcquire(
                f"{words.who} already leads election {self.name!r} (or holds its lock) in {words.block} of this "
                "Redlock: a nested campaign() would wait for itself. Use the term already held, or resign first",
                name=self.name if isinstance(self.name, str) else repr(self.name),
            )
        settings = self._cluster.lease_settings(self._settings, acquire_timeout=limit)
        lock = Lock(self._cluster, self.name, settings, owner=self.owner)
        async with lock:
            term = lock.fencing_token
            assert term is not None  # elections are fenced
            # Observers of this process and others learn of the new leader now, not at their next look.
            for node in self._cluster.nodes:
                node.send(b"PUBLISH", self._key + LEADER_CHANNEL, term)
            yield term

    async def leader(self) -> LockInfo:
        """The current leader as the nodes say (``Redlock.inspect`` of the election's name): ``state``
        ``"held"`` with its ``owner`` and, as ``fencing_counter``, its term; or ``"free"`` / ``"unknown"``.

        The term shown is always the leader's own: a leader caught between its grant and its
        fence (a round trip) is looked at again a few times, briefly; if its fence is still not
        written, ``fencing_counter`` is None (never an earlier leader's term).
        """
        info = await self._inspect(self.name)
        delay = UNFENCED_FIRST
        while info.state == "held" and info.fencing_counter is None and delay <= UNFENCED_LAST:
            await asyncio.sleep(delay)
            delay *= 2
            info = await self._inspect(self.name)
        return info

    async def observe(self) -> AsyncGenerator[LockInfo, None]:
        """The current leader first (if any), then each new leader, in order; never the same term twice.

        Free and unknown states are not yielded, nor a leader whose term is not written yet (it
        is yielded once it is). A new leader is seen when it announces itself (within about one
        hand-off of a resignation) or, if that word is lost, at the next look: every
        ``max(retry_delay, ttl / 10)`` seconds, never faster. The announcement channels are looked
        at again once the nodes confirm the subscription, so a word said before then is not missed.
        """
        listener = self._cluster.listener
        changed = asyncio.Event()
        pace = max(self._settings.retry_delay, self._settings.ttl / 10)
        channels = (self._key + LEADER_CHANNEL, self._key)  # announcements, and release words
        for channel in channels:
            listener.watch(channel, changed.set, mark=channel == self._key)  # (the key's releases need the mark)
        last_holder: str | None = None
        last_term = -1
        unfenced = UNFENCED_FIRST
        try:
            while True:
                changed.clear()
                info = await self._inspect(self.name)
                wait = pace
                term = info.fencing_counter
                if info.state == "held" and term is None:
                    # Between its grant and its fence: its term is written within a round trip or so.
                    wait, unfenced = min(unfenced, pace), unfenced * 2
                else:
                    unfenced = UNFENCED_FIRST
                    if info.state == "held" and term is not None and info.holder != last_holder and term > last_term:
                        last_holder, last_term = info.holder, term
                        yield info
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await changed.wait()
        finally:
            for channel in channels:
                listener.unwatch(channel, changed.set)


UNFENCED_FIRST = 0.005
"""Seconds before a leader whose term is not written yet is looked at again (doubling each time)."""
UNFENCED_LAST = 0.16
"""``leader()`` looks again at most until this delay (about 0.3 s in all), then shows no term."""
