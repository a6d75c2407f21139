"""``Lock``: one resource's lease on a majority of nodes.

A Lock is made by :meth:`Redlock.lock` and can be acquired, extended and
released any number of times, one acquisition at a time. Each acquisition
uses a new random token, so a stale release can never delete a later lease.

The class is a front built from parts, each in its own room: the lock's life and its phase
table (``_lease.Tenure``), how it is taken (an acquire strategy, ``_strategies``), how a held
lease is kept, lost and released (``_keeper``), ``async with`` (``_guard``) and its events
(``_emitter``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Self

from redlock_async._core import Name, Settings, check_duration, check_owner, default_owner, renamed
from redlock_async._core import clock as _clock
from redlock_async._core import holder as _holder
from redlock_async._lock import (
    Keeper,
    Many,
    Queued,
    Strategy,
    Words,
    emit,
    emit_lost,
    heard,
)
from redlock_async._lock import guard as _guard
from redlock_async._rounds import Phase
from redlock_async._rounds import reason as not_acquired_reason
from redlock_async._shared import Cluster
from redlock_async.errors import LockLost, NestedAcquire, NodeOutcome
from redlock_async.events import EventKind
from redlock_async.statistics import LockStatistics

# Members as module globals: on Python 3.11 ``Phase.HELD`` goes through EnumType.__getattr__'s hook
# (~900 machine instructions a read; see _algorithm.YES), and the lock path reads a dozen per pair.
_IDLE, _ACQUIRING, _HELD, _LOST = Phase.IDLE, Phase.ACQUIRING, Phase.HELD, Phase.LOST
_ACQUIRED, _NOT_ACQUIRED, _LOST_EVENT = EventKind.ACQUIRED, EventKind.NOT_ACQUIRED, EventKind.LOST


def label_of(name: Name | tuple[Name, ...]) -> str:
    """A lock's name as errors and events carry it: text as is, bytes as their repr, several joined by +."""
    if isinstance(name, tuple):
        return "+".join(one if isinstance(one, str) else repr(one) for one in name)
    return name if isinstance(name, str) else repr(name)


class Lock:
    """A distributed lock on one resource (or, made by ``lock_many``, several taken all at once),
    held on a majority of the Redlock's nodes.

    ``async with lock:`` acquires (blocking up to the acquire timeout) and
    releases on exit. ``acquire()``, ``extend()`` and ``release()`` give
    finer control. A Lock is not reentrant and serves one acquisition at a
    time; make one Lock per task that wants the resource. A task that asks
    again for a name it holds inside ``async with`` (through any lock of the
    same Redlock) gets :class:`NestedAcquire` at once.
    """

    __slots__ = ("__weakref__", "_cluster", "_keeper", "_settings", "_strategy", "_tenure", "cooldown", "name")

    def __init__(
        self,
        cluster: Cluster,
        name: Name | tuple[Name, ...],
        settings: Settings,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
        strategy: Strategy | None = None,
    ) -> None:
        if strategy is None:
            # One name, or lock_many's canonical tuple of names: every key is taken, all or none.
            names: tuple[Name, ...] = name if isinstance(name, tuple) else (name,)
            kind = Queued if settings.queue else Many if len(names) > 1 else Words
            strategy = kind(cluster, settings, names, check_owner(owner), name)
        self.name: Name | tuple[Name, ...] = name
        """The name given to ``lock()``; for ``lock_many``, the tuple of names (as :attr:`names`)."""
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a function taking the LockLost (or None), got {type(on_lost).__name__}")
        self._cluster = cluster
        self._settings = settings
        self._strategy = strategy
        self._keeper = Keeper(strategy, cluster, settings, name, label_of(name), on_lost)
        self._tenure = self._keeper.tenure
        self.cooldown = cooldown
        """Seconds the keys are kept after release (at most once per period), None: release deletes them."""

    def __repr__(self) -> str:
        return f"<redlock_async.Lock {self.name!r} {self._tenure.phase.value} validity={self.validity:.3f}s>"

    @property
    def on_lost(self) -> Callable[[LockLost], object] | None:
        """Called with the LockLost when the watchdog loses the lock; the body is then not cancelled."""
        return self._tenure.on_lost

    @on_lost.setter
    def on_lost(self, on_lost: Callable[[LockLost], object] | None) -> None:
        self._tenure.tell_loss_to(on_lost)

    @property
    def ttl(self) -> float:
        """Lease length in seconds for each acquire and extend."""
        return self._settings.ttl

    @property
    def held(self) -> bool:
        """True while the lock is acquired and its validity has not run out."""
        tenure = self._tenure
        return tenure.phase is _HELD and _clock.now() < tenure.lease.expires

    @property
    def validity(self) -> float:
        """Seconds for which the lease can still be trusted (0.0 when not held)."""
        tenure = self._tenure
        if tenure.phase is not _HELD:
            return 0.0
        return max(0.0, tenure.lease.expires - _clock.now())

    @property
    def token(self) -> str | None:
        """The random value of the current acquisition, None when not held."""
        tenure = self._tenure
        token = tenure.lease.token
        return token.decode() if token is not None and tenure.phase is _HELD else None

    @property
    def owner(self) -> str:
        """The label stored with this lock's keys, which inspection shows (default: ``<hostname>:<pid>``)."""
        return (self._strategy.owner or default_owner()).decode(errors="replace")

    @property
    def names(self) -> tuple[Name, ...]:
        """The names this lock takes, deduplicated and in the order they are taken (sorted by their bytes)."""
        return self._strategy.names

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition (``fencing=True`` locks), None when not held.

        Strictly greater than the token of every earlier grant of this
        resource, through any client, as long as the nodes keep their data.
        Pass it to the protected resource, which refuses smaller ones.
        For ``lock_many``, the first name's; :attr:`fencing_tokens` has each name's.
        """
        tenure = self._tenure
        return tenure.lease.fencing_token if tenure.phase is _HELD else None

    @property
    def fencing_tokens(self) -> dict[Name, int] | None:
        """Each name's fencing token ({name: int}; the same per-name counters single locks use),
        None when not held or not fenced."""
        tenure = self._tenure
        tokens = tenure.lease.fencing_tokens
        if tenure.phase is not _HELD or tokens is None:
            return None
        return dict(zip(self._strategy.names, tokens, strict=True))

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node outcomes of the last acquire attempt, extend or release."""
        return self._keeper.outcomes()

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock and its current (or last) acquisition; reads no node."""
        tenure = self._tenure
        held = self.held
        return LockStatistics(
            name=self.name,
            phase=tenure.phase.value,
            held=held,
            validity=self.validity,
            attempts=tenure.attempts,
            extensions=tenure.lease.extensions,
            held_for=_clock.now() - tenure.lease.acquired_at if held else None,
            fencing_token=self.fencing_token,
            watched=tenure.watched,
        )

    # -- acquire, extend, release -----------------------------------------------------

    async def acquire(self, *, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; True when acquired, False when the time ran out.

        Blocking (the default) retries after a random delay until *timeout*
        seconds (default: the lock's ``acquire_timeout``) have passed; with
        ``blocking=False`` there is exactly one attempt. Nothing is left on
        any node when it returns False or is cancelled. Raises
        :class:`NestedAcquire`, before any node is asked, when the current task
        holds what it asks for inside ``async with`` of this Redlock.
        """
        if not isinstance(blocking, bool):
            raise TypeError(
                f"blocking must be True or False, got {type(blocking).__name__}: for a time limit, pass timeout="
            )
        tenure, cluster = self._tenure, self._cluster
        if tenure.phase is _ACQUIRING:
            raise RuntimeError(f"lock {self.name!r} is already being acquired: use one Lock per task")
        if cluster.bound and (nested := nested_acquire(self, _holder.current())) is not None:
            raise nested  # some lock of this Redlock is held inside `async with`, by this task (or thread)
        if tenure.phase is _HELD and _clock.now() < tenure.lease.expires:  # (self.held, inline: the hot path)
            raise RuntimeError(f"lock {self.name!r} is already held: a Lock is not reentrant")
        if not blocking and timeout is not None:
            raise ValueError("acquire(blocking=False) makes one attempt: a timeout means nothing there; drop one")
        limit = (
            self._settings.acquire_timeout
            if timeout is None
            else check_duration("timeout", timeout, zero_ok=True, inf_ok=True)
        )
        cluster.check_open()
        if cluster.first_use is not None:  # the first acquire of a Redlock that never connected: its checks
            await cluster.first_use()
        lease = tenure.lease
        stale = lease.token  # an earlier acquisition's, which may still be on some nodes
        if tenure.phase is _HELD:
            # Acquired, never released, and its validity ran out: that acquisition is over (its stale
            # lease is released just below). It was an IllegalMove (held -> acquiring).
            tenure.to(_IDLE)
            if heard(cluster, _LOST_EVENT):  # it ended without a release: told as a loss, as the watchdog's are
                emit_lost(
                    cluster, tenure, f"lock {self.name!r} ran out before it was extended or released", watchdog=False
                )
        if stale is not None:
            self._strategy.send_release(lease, stale, lease.skip)
        tenure.to(_ACQUIRING)
        began = _clock.now()
        acquired = await self._strategy.acquire(tenure, blocking, began + limit)
        if not heard(cluster, _ACQUIRED):
            pass  # no one listens: the event's fields are not worked out
        elif acquired:
            woken_at = tenure.woken_at
            emit(
                cluster,
                tenure,
                _ACQUIRED,
                duration=_clock.now() - began,
                attempts=tenure.attempts,
                validity=self.validity,
                fencing_token=self.fencing_token,
                handoff=None if woken_at is None else _clock.now() - woken_at,
            )
        else:
            reason = not_acquired_reason(tenure.votes, blocking)
            emit(cluster, tenure, _NOT_ACQUIRED, duration=_clock.now() - began, attempts=tenure.attempts, reason=reason)
        return acquired

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to *ttl* seconds from now (default: the lock's ttl) on a majority, and take
        the nodes where its key is free (held on a bare majority, it regains the others).

        Raises :class:`LockLost` when no majority extended it before the
        current validity ran out; the lock is then lost for good (a later
        extend cannot bring it back) and its keys are released.
        """
        tenure = self._tenure
        if tenure.phase is _LOST:
            raise tenure.lost or LockLost(f"lock {self.name!r} was lost", name=tenure.label)
        if tenure.phase is not _HELD or tenure.lease.token is None:
            raise RuntimeError(f"extend() of lock {self.name!r}, which is not held: acquire it first")
        settings = self._settings
        await self._keeper.extend(settings if ttl is None else self._cluster.lease_settings(settings, ttl=ttl))

    async def release(self) -> None:
        """Delete the lease on every node (only where it is still this acquisition's).

        Returns when the nodes that held it answered, or after the node
        timeout; a node that did not answer keeps the key until it expires.
        Raises :class:`ReleaseFailed` (the lock no longer held all the same) when
        the release answered errors on so many nodes that no majority is left
        free: no one can take it until the key expires there. Releasing a lost
        lock does nothing; releasing one that is not held is a RuntimeError.
        """
        await self._keeper.release(self.cooldown)

    # -- async with ------------------------------------------------------------------

    # Not coroutines themselves: each returns its guard's, which ``async with`` awaits (one coroutine less
    # in the chain every wake-up of the acquire and of the release runs through).
    def __aenter__(self) -> Coroutine[Any, Any, Self]:
        return _guard.aenter(self, self._keeper)

    def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Coroutine[Any, Any, None]:
        return _guard.aexit(self, self._keeper, exc_type, exc)

    @property
    def resource(self) -> Name | tuple[Name, ...]:
        """Deprecated spelling of :attr:`name`."""
        renamed("Lock.resource", ".name")
        return self.name


def keeper_of(lock: Lock) -> Keeper:
    """The part that keeps *lock*'s lease while held (for a read/write lock's downgrade and
    ``redlock_async.testing``): the Redlock tells it what happened (closed, a node lost, the watchdog
    failed), and a downgrade hands the lease over through it."""
    return lock._keeper


def cluster_of(lock: Lock) -> Cluster:
    """What *lock* shares with the other locks of its Redlock (for ``redlock_async.testing``); reads no node."""
    return lock._cluster


def strategy_of(lock: Lock) -> Strategy:
    """How *lock* is taken (for ``redlock_async.testing``); reads no node."""
    return lock._strategy


def nested_acquire(lock: Lock, holder: object) -> NestedAcquire | None:
    """The NestedAcquire for *holder* (a task; a thread of the blocking API) asking *lock* for what it holds
    inside ``async with`` of the same Redlock (the blocking API's ``with`` or ``acquire()``), None when it
    holds too little of it to wait for itself: another holder (a child task too) waits as any other.
    For the library's fronts (the blocking API asks it of a lock entered again); reads no node."""
    cluster, strategy = lock._cluster, lock._strategy
    for name, key in zip(strategy.names, strategy.keys, strict=False):
        if cluster.held_by(key, holder) < strategy.permits:
            continue
        words = _holder.described(holder)
        asking = "acquiring it again" if len(strategy.keys) == 1 else f"lock_many({list(strategy.names)!r})"
        return NestedAcquire(
            f"{words.who} already holds {strategy.held_words(name)} in {words.block} of this Redlock: {asking} "
            "would wait for itself until the acquire timeout. Use the lock already held, or release it first (a "
            f"lock of one name may be made reentrant, for this {words.kind} to enter again at once: "
            "redlock.lock(name, reentrant=True), both)",
            name=lock._tenure.label,
        )
    return None
