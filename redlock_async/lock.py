"""``Lock``: one resource's lease on a majority of nodes.

A Lock is made by :meth:`Redlock.lock` and can be acquired, extended and
released any number of times, one acquisition at a time. Each acquisition
uses a new random token, so a stale release can never delete a later lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from redlock_async import _algorithm, _clock, _handoff, _line, _queue, _queue_wait, _requests
from redlock_async._cleanup import complete
from redlock_async._cluster import Cluster
from redlock_async._deprecated import renamed
from redlock_async._fanout import Ballot, outcomes, sitting_out, vote_of_script
from redlock_async._lease import Lease, Phase, move
from redlock_async._names import Name, check_owner, default_owner, released_word, resource_key
from redlock_async._not_acquired import not_acquired
from redlock_async._not_acquired import reason as not_acquired_reason
from redlock_async._settings import Settings, check_duration
from redlock_async.errors import LockLost, NestedAcquire, NodeOutcome
from redlock_async.events import EventKind, LockEvent
from redlock_async.statistics import LockStatistics

log = logging.getLogger(__name__)

# Members as module globals: on Python 3.11 ``Phase.HELD`` goes through EnumType.__getattr__'s hook
# (~900 machine instructions a read; see _algorithm.YES), and the lock path reads a dozen per pair.
_IDLE, _ACQUIRING, _HELD, _LOST = Phase.IDLE, Phase.ACQUIRING, Phase.HELD, Phase.LOST
_ACQUIRED, _NOT_ACQUIRED, _RELEASED = EventKind.ACQUIRED, EventKind.NOT_ACQUIRED, EventKind.RELEASED
_LOST_EVENT = EventKind.LOST

_random = random.SystemRandom()


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

    __slots__ = (
        "__weakref__",
        "_attempts",
        "_blocked",
        "_bound",
        "_cancelled_host",
        "_cluster",
        "_fence_keys",
        "_host",
        "_host_cancelling",
        "_keys",
        "_last_details",
        "_last_votes",
        "_lease",
        "_lost",
        "_names",
        "_owner",
        "_settings",
        "_state",
        "_watched",
        "_woken_at",
        "cooldown",
        "name",
        "on_lost",
    )

    def __init__(
        self,
        cluster: Cluster,
        name: Name | tuple[Name, ...],
        settings: Settings,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
        cooldown: float | None = None,
    ) -> None:
        self._owner = check_owner(owner)
        # One name, or lock_many's canonical tuple of names: every key is taken, all or none.
        self._names: tuple[Name, ...] = name if isinstance(name, tuple) else (name,)
        self._keys = tuple(resource_key(settings.key_prefix, one) for one in self._names)
        self._fence_keys = tuple(resource_key(settings.fence_prefix, one) for one in self._names)
        self._blocked = self._keys[0]  # the key a failed attempt found held: the one its waiter listens on
        self.name: Name | tuple[Name, ...] = name
        """The name given to ``lock()``; for ``lock_many``, the tuple of names (as :attr:`names`)."""
        self._cluster = cluster
        self._settings = settings
        self._state = _IDLE
        self._lease = Lease(self._keys)  # the current (or last) acquisition's; a new one at each grant
        # Per-node votes of the last attempt; NodeOutcomes are built only when asked for.
        self._last_votes: Sequence[_algorithm.Vote] = ()
        self._last_details: Sequence[str] | None = None
        self._attempts = 0  # rounds sent by the acquire in progress (or the last one)
        self._woken_at: float | None = None  # when a release last woke the acquire in progress, if it did
        self._lost: LockLost | None = None  # why the last acquisition was lost
        # The watchdog (inside `async with`): the task running the body, its
        # cancel count on entry, and whether we cancelled it because of a loss.
        self._watched = False
        self._host: asyncio.Task[object] | None = None
        self._host_cancelling = 0
        self._cancelled_host = False
        # The task holding this lock inside `async with` (Cluster.bind): a nested acquire by it fails at once.
        self._bound: asyncio.Task[Any] | None = None
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a function taking the LockLost (or None), got {type(on_lost).__name__}")
        self.on_lost = on_lost
        """Called with the LockLost when the watchdog loses the lock; the body is then not cancelled."""
        self.cooldown = cooldown
        """Seconds the keys are kept after release (at most once per period), None: release deletes them."""

    def __repr__(self) -> str:
        return f"<redlock_async.Lock {self.name!r} {self._state.value} validity={self.validity:.3f}s>"

    # -- state ----------------------------------------------------------------

    def _drop(self) -> None:
        """The lease ended (released or lost): no longer held, nor bound to its task."""
        self._cluster.held.discard(self)
        if self._bound is not None:
            self._cluster.unbind(self._keys, self._bound)
            self._bound = None

    def _permits(self) -> int:
        """How many holds of its key one task may have before asking for another would wait for itself."""
        return 1

    def _refuse_nested(self) -> None:
        """Raise NestedAcquire when the current task holds, inside ``async with``, what this acquire asks
        for: it would wait for itself until its timeout. Another task (a child task too) waits as any other."""
        task = asyncio.current_task()
        cluster = self._cluster
        for name, key in zip(self._names, self._keys, strict=False):
            if cluster.held_by(key, task) < self._permits():
                continue
            asking = "acquiring it again" if len(self._keys) == 1 else f"lock_many({list(self._names)!r})"
            raise NestedAcquire(
                f"this task ({task.get_name() if task else '?'}) already holds {self._held_words(name)} in an "
                f"enclosing `async with` of this Redlock: {asking} would wait for itself until the acquire "
                "timeout. Use the lock already held, or release it first (reentrant locks, "
                "redlock.lock(name, reentrant=True), are planned for a later release)",
                name=self._label,
            )

    def _held_words(self, name: Name) -> str:
        """What the task already holds, in words, for NestedAcquire."""
        return f"lock {name!r}"

    @property
    def ttl(self) -> float:
        """Lease length in seconds for each acquire and extend."""
        return self._settings.ttl

    @property
    def held(self) -> bool:
        """True while the lock is acquired and its validity has not run out."""
        return self._state is _HELD and _clock.now() < self._lease.expires

    @property
    def validity(self) -> float:
        """Seconds for which the lease can still be trusted (0.0 when not held)."""
        if self._state is not _HELD:
            return 0.0
        return max(0.0, self._lease.expires - _clock.now())

    @property
    def token(self) -> str | None:
        """The random value of the current acquisition, None when not held."""
        return self._lease.token.decode() if self._lease.token is not None and self._state is _HELD else None

    @property
    def owner(self) -> str:
        """The label stored with this lock's keys, which inspection shows (default: ``<hostname>:<pid>``)."""
        return (self._owner or default_owner()).decode(errors="replace")

    @property
    def names(self) -> tuple[Name, ...]:
        """The names this lock takes, deduplicated and in the order they are taken (sorted by their bytes)."""
        return self._names

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition (``fencing=True`` locks), None when not held.

        Strictly greater than the token of every earlier grant of this
        resource, through any client, as long as the nodes keep their data.
        Pass it to the protected resource, which refuses smaller ones.
        For ``lock_many``, the first name's; :attr:`fencing_tokens` has each name's.
        """
        return self._lease.fencing_token if self._state is _HELD else None

    @property
    def fencing_tokens(self) -> dict[Name, int] | None:
        """Each name's fencing token ({name: int}; the same per-name counters single locks use),
        None when not held or not fenced."""
        tokens = self._lease.fencing_tokens
        if self._state is not _HELD or tokens is None:
            return None
        return dict(zip(self._names, tokens, strict=True))

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node outcomes of the last acquire attempt, extend or release."""
        if not self._last_votes:
            return ()
        return outcomes(self._cluster.nodes, self._last_votes, self._last_details)

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock and its current (or last) acquisition; reads no node."""
        held = self.held
        return LockStatistics(
            name=self.name,
            phase=self._state.value,
            held=held,
            validity=self.validity,
            attempts=self._attempts,
            extensions=self._lease.extensions,
            held_for=_clock.now() - self._lease.acquired_at if held else None,
            fencing_token=self.fencing_token,
            watched=self._watched,
        )

    # -- acquire ----------------------------------------------------------------

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
        if self._state is _ACQUIRING:
            raise RuntimeError(f"lock {self.name!r} is already being acquired: use one Lock per task")
        if self._cluster.bound:  # some lock of this Redlock is held inside `async with`
            self._refuse_nested()
        if self.held:
            raise RuntimeError(f"lock {self.name!r} is already held: a Lock is not reentrant")
        if not blocking and timeout is not None:
            raise ValueError("acquire(blocking=False) makes one attempt: a timeout means nothing there; drop one")
        limit = (
            self._settings.acquire_timeout
            if timeout is None
            else check_duration("timeout", timeout, zero_ok=True, inf_ok=True)
        )
        self._cluster.check_open()
        if self._state is _HELD:
            # Acquired, never released, and its validity ran out: that acquisition is over (its stale
            # lease is released just below). It was an IllegalMove (held -> acquiring).
            self._state = move(self._state, _IDLE)
            self._drop()
            if self._heard(EventKind.LOST):  # it ended without a release: told as a loss, as the watchdog's are
                self._emit_lost(f"lock {self.name!r} ran out before it was extended or released", watchdog=False)
        if self._lease.token is not None:
            self._send_release(self._lease.token, skip=self._lease.skip)  # a stale lease of an earlier acquisition
        self._lease.token = None
        self._state = move(self._state, _ACQUIRING)
        began = _clock.now()
        self._attempts = 0
        self._woken_at = None
        if self._queued():
            acquired = await self._acquire_queued(blocking, began + limit)
        else:
            acquired = await self._acquire(blocking, began + limit)
        if not self._heard(_ACQUIRED):
            pass  # no one listens: the event's fields are not worked out
        elif acquired:
            self._emit(
                _ACQUIRED,
                duration=_clock.now() - began,
                attempts=self._attempts,
                validity=self.validity,
                fencing_token=self.fencing_token,
                handoff=None if self._woken_at is None else _clock.now() - self._woken_at,
            )
        else:
            self._emit(
                _NOT_ACQUIRED,
                duration=_clock.now() - began,
                attempts=self._attempts,
                reason=not_acquired_reason(self._last_votes, blocking),
            )
        return acquired

    async def _acquire(self, blocking: bool, give_up: float) -> bool:
        listener = self._cluster.listener if self._settings.wait_for_release and blocking else None
        listening = woken = attempted = False
        place = _line.ticket()
        try:
            # Try at once (the key may be free while waiters of this process wait for their timers),
            # unless the line is taking it now or a lock of this Redlock holds it: then join the line.
            channel = self._channel()
            queued = (
                listener is not None
                and listener.waiting(channel)
                and (listener.taking(channel) or len(self._cluster.bound.get(channel, ())) >= self._permits())
            )
            while True:
                if not queued:
                    attempted = True
                    if await self._attempt():
                        return True
                remaining = give_up - _clock.now()
                # Never give up without one attempt: a blocking acquire does no worse than blocking=False.
                if not blocking or (remaining <= 0 and attempted):
                    return False
                delay = _algorithm.retry_delay(self._settings.retry_delay, _random.random(), max(remaining, 0.0))
                if listener is None:
                    await self._cluster.pause(delay)
                else:
                    if listening and self._channel() != channel:
                        # lock_many: its last attempt found another name held. Listen for that
                        # one's release instead, keeping our ticket (our place in its line).
                        if woken:
                            listener.done(channel)
                        listener.quit(channel, place)
                        listener.leave(channel)
                        listening = woken = False
                    if not listening:
                        listening = True
                        # Listen first, then look again: a release between the failed attempt
                        # and a new subscription would otherwise go unheard. An existing
                        # subscription already heard it, and woke the oldest waiter.
                        channel = self._channel()  # lock_many: the key its last attempt found held
                        if await listener.enter(channel) and not queued and await self._attempt():
                            return True
                    # Woken by a release (our turn among this process's waiters), or after
                    # the jittered delay if no word came: notifications can be lost. A release
                    # of this Redlock may have sent our next round already (handed it over).
                    taker = _handoff.Taker(self._presend, self._give_back) if self._takes_hand_over else None
                    woken = await listener.wait(channel, delay, place, again=woken, taker=taker)
                    self._woken_at = _clock.now() if woken else None  # the hand-off latency starts here
                    queued = False
                    if woken and (sent := listener.handed(channel, place)) is not None:
                        attempted = True
                        if await self._attempt(sent):
                            return True
                        queued = True  # that was this wake-up's try: wait again
                # Closed meanwhile, or a background task failed: say so now, not at the timeout.
                self._cluster.check_open()
                if _clock.now() >= give_up and attempted:
                    return False
        finally:
            if self._state is _ACQUIRING:
                self._state = move(self._state, _IDLE)
            if listening and listener is not None:
                if woken:
                    listener.done(channel)  # the next release wakes the next waiter
                listener.quit(channel, place)
                listener.leave(channel)

    _queues = True
    """With ``queue=True`` (the default), this kind of lock waits in the nodes' grant queue (a semaphore
    does not yet)."""

    def _queued(self) -> bool:
        """This lock waits in the nodes' grant queue: ``queue=True`` (the default), not a semaphore."""
        return self._settings.queue is True and self._queues

    async def _acquire_queued(self, blocking: bool, give_up: float) -> bool:
        """:meth:`_acquire` through the nodes' grant queue (``queue=True``, docs/algorithm.md). The first try
        is the default path's own round (:meth:`_attempt`: SET NX, or fenced, ACQUIRE_FENCED and its fence;
        lock_many: ACQUIRE_ALL): uncontended, the queue costs nothing more. A try that finds a key held
        joins the lines with one claim per name (one token, one place in every line), entered on every node
        at each try, held once a majority holds every key for its token, whether a node set it at once or
        granted it later (a release handing it on): :mod:`_queue_wait`."""
        listener = self._cluster.listener
        settings = self._settings
        nodes = self._cluster.nodes
        claims: list[_queue.Claim] = []
        subscribed: list[bytes] = []
        done = False
        try:
            if await self._attempt() or not blocking or _clock.now() >= give_up:
                done = True
                return self._state is _HELD
            token = _requests.new_token(self._owner or default_owner())
            score, bell = _queue.new_score(), _queue.Bell()
            for key, fence_key in zip(self._keys, self._fence_keys, strict=True):
                claim = _queue.Claim(nodes, key, settings, token, fence_key, score=score, bell=bell)
                claims.append(claim)
                listener.expect(key, claim)  # before our first entry: a grant word heard from then on is ours
            # Each node's confirmation of a subscription made after our entry pokes the claim: a grant
            # published before it went unheard, so we enter again at once.
            for key in self._keys:
                subscribed.append(key)
                await listener.enter(key)
            # A name held while another is not is given back after about a retry delay (lock_many).
            grace = _queue.patience(nodes, settings.node_timeout)
            hold_back = max(grace, settings.retry_delay)
            while True:
                self._cluster.check_open()  # a background task failed (the subscribers'?): say so now
                self._attempts += 1
                _queue_wait.enter(claims)
                # One try: until a majority holds every key for us, or every node answered (or timed out).
                grace = _queue.patience(nodes, settings.node_timeout)
                won = await _queue_wait.claimed(claims, _clock.now() + grace, grace, hold_back, until_answered=True)
                now = _clock.now()
                if won is None and now < give_up:
                    # Wait in line: grant words (a release handing the key on) until the next try.
                    delay = _algorithm.retry_delay(settings.retry_delay, _random.random(), give_up - now)
                    won = await _queue_wait.claimed(claims, now + delay, grace, hold_back, until_answered=False)
                    if won is not None:
                        listener.granted()  # a release handed it to us, not our fallback timer
                if won is not None:
                    done = True
                    self._take_claim(token, won)
                    return True
                self._cluster.check_open()  # closed meanwhile, or a background task failed: say so now
                if _clock.now() >= give_up:
                    done = True
                    self._last_votes, self._last_details = _queue_wait.votes(
                        claims, _clock.now(), grace
                    )  # before leave()
                    _queue_wait.leave(claims)  # out of every line, and whatever a node granted us goes on
                    await _queue_wait.settled(claims, _queue.patience(nodes, settings.node_timeout))
                    return False
        finally:
            if self._state is _ACQUIRING:
                self._state = move(self._state, _IDLE)
            for claim in claims:
                listener.unexpect(claim.keys[0], claim)
            if not done:
                _queue_wait.leave(claims)  # cancelled, or failed: queued now, before the exception goes on
            for key in subscribed:
                listener.leave(key)

    def _take_claim(self, token: bytes, won: _queue_wait.Won) -> None:
        n = len(self._cluster.nodes)
        yes, pending = _algorithm.YES, _algorithm.PENDING  # the others may grant it later
        holders = won.holders
        self._last_votes = [yes if i in holders else pending for i in range(n)]
        self._last_details = None
        tokens = won.fencing_tokens
        self._lease = Lease(
            self._keys, token, ttl_ms=self._settings.ttl_ms, acquired_at=won.at, expires=won.end,
            holders=holders, skip=[], fencing_token=None if tokens is None else tokens[0],
            fencing_tokens=tokens,
            fence_keys=() if tokens is None else self._fence_keys, fence_ttl_ms=self._settings.fence_ttl_ms,
            regain=[i for i in range(n) if i not in holders],
        )  # fmt: skip
        self._lost = None
        self._state = move(self._state, _HELD)
        self._cluster.held.add(self)

    async def _attempt(self, sent: _requests.Sent | None = None) -> bool:
        """One round of SET NX PX on all nodes (*sent* already, by a releaser handing the lock over);
        True when a majority granted a valid lease."""
        self._attempts += 1
        result = await self._take(sent)
        self._last_votes, self._last_details = result.votes, result.details
        if result.validity is None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("redlock %r not acquired: %s", self.name, ", ".join(map(str, self.outcomes)))
            return False
        tokens = result.fencing_tokens
        self._lease = Lease(
            result.keys,
            result.token,
            ttl_ms=self._settings.ttl_ms,
            acquired_at=result.started,
            expires=result.decided_at + result.validity,
            holders=result.holders,
            skip=result.skip,
            fencing_token=tokens[0] if tokens else None,
            fencing_tokens=tokens,
            keeps=result.keeps,
            fence_keys=self._fence_keys if tokens else (),
            fence_ttl_ms=self._settings.fence_ttl_ms,
            late=result.late,
        )
        self._lost = None
        self._state = move(self._state, _HELD)
        self._cluster.held.add(self)
        return True

    async def _take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        """One round for every key of this lock (all or none)."""
        result = await _requests.decide(
            self._cluster.nodes, self._keys, self._fence_keys, self._settings, sent or self._presend()
        )
        if result.codes and len(self._keys) > 1:
            # The key most of the refusing nodes found held: a waiter listens for its release.
            self._blocked = self._keys[max(set(result.codes), key=result.codes.count) * -1 - 1]
        return result

    _takes_hand_over = True
    """A release of this Redlock may send this lock's next round (see :meth:`_presend`)."""

    def _presend(self) -> _requests.Sent:
        """Send this lock's next round now (synchronous): a release of this Redlock hands the lock over
        to its oldest waiter by queueing the waiter's round right behind the release on every node."""
        cluster = self._cluster
        return _requests.send_attempt(
            cluster.nodes,
            self._keys,
            self._fence_keys,
            self._settings,
            self._owner or default_owner(),
            cluster.reading(),
        )

    def _give_back(self, sent: _requests.Sent) -> None:
        """A round sent for this lock that its waiter will never count (cancelled in the same loop turn)."""
        _requests.give_back(self._cluster.nodes, self._keys, sent)

    def _next_is_ours(self, token: bytes) -> bool:
        """True when a release of this lock may hand it over: the next in line for its key is a waiter
        of this Redlock (then :meth:`release` sends that waiter's round right behind the release)."""
        return (
            self._settings.wait_for_release
            and not self._settings.queue
            and len(self._keys) == 1
            and self._cluster.listener.may_hand_over(self._keys[0], released_word(token))
        )

    def _channel(self) -> bytes:
        """Where a waiter listens for the release that may let it in."""
        return self._blocked

    def _send_release(
        self, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        """Queue compare-and-delete on every node but *skip* (synchronous: survives cancellation)."""
        if self._queued():  # to each key's next waiter
            nodes = self._cluster.nodes
            if len(self._keys) == 1:
                _queue.release(nodes, self._lease.keys[0], self._fence_keys[0], token, into, skip)
            else:
                _queue.release_all(nodes, self._lease.keys, self._fence_keys, token, into, skip)
            return
        _requests.send_release(self._cluster.nodes, self._lease.keys, token, skip, into=into, handed=handed)

    # -- extend -------------------------------------------------------------------

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to *ttl* seconds from now (default: the lock's ttl) on a majority, and take
        the nodes where its key is free (held on a bare majority, it regains the others).

        Raises :class:`LockLost` when no majority extended it before the
        current validity ran out; the lock is then lost for good (a later
        extend cannot bring it back) and its keys are released.
        """
        if self._state is _LOST:
            raise self._lost or LockLost(f"lock {self.name!r} was lost", name=self._label)
        if self._state is not _HELD or self._lease.token is None:
            raise RuntimeError(f"extend() of lock {self.name!r}, which is not held: acquire it first")
        await self._extend(self._settings if ttl is None else self._cluster.lease_settings(self._settings, ttl=ttl))

    async def _extend(self, settings: Settings) -> None:
        """:meth:`extend` to *settings*' ttl (a cooldown's too, which is no lease for the restart quarantine)."""
        nodes = self._cluster.nodes
        token = self._lease.token
        assert token is not None  # held: the callers checked
        ttl_ms = settings.ttl_ms
        first_sent = _clock.now()
        try:
            while True:
                if self._state is not _HELD or self._lease.token != token:
                    # Lost (the watchdog, or the Redlock closed) or released during our retry's sleep:
                    # an extension now would take free nodes for a lease no one holds.
                    raise self._lost or LockLost(f"lock {self.name!r} was lost", name=self._label)
                started = _clock.now()
                if started >= self._lease.expires:
                    raise await self._lose(
                        f"lock {self.name!r} could not be extended on a majority before it ran out",
                        self._lease.holders,
                    )
                # Votes after the old validity ends prove nothing: stop waiting then.
                timeout = min(settings.node_timeout, self._lease.expires - started)
                clock = self._cluster.reading()
                ballot = _requests.send_extend(nodes, self._lease, ttl_ms, timeout, clock)
                if self._lease.keeps is not None:
                    _requests.send_keep(nodes, self._lease.keys[0], self._lease.keeps, token, ttl_ms)
                await ballot.wait()
                self._last_votes, self._last_details = ballot.votes, ballot.details
                verdict, validity = _algorithm.judge_extension(
                    ballot.votes,
                    ttl_ms / 1000,
                    started,
                    ballot.decided_at,
                    settings.drift_factor,
                    deadline=self._lease.expires,
                    now=_clock.now(),
                )
                if self._state is not _HELD or self._lease.token != token:
                    # The watchdog declared it lost (or the Redlock closed) while we waited.
                    raise self._lost or LockLost(f"lock {self.name!r} was lost", name=self._label)
                self._lease.regain, self._lease.late = [], _requests.answers(ballot)
                if validity is not None:
                    margin = self._lease.expires - ballot.decided_at
                    self._lease.expires = ballot.decided_at + validity
                    self._lease.holders = ballot.voted(_algorithm.YES)
                    self._emit(
                        EventKind.EXTENDED,
                        duration=ballot.decided_at - first_sent,
                        margin=margin,
                        validity=validity,
                        fencing_token=self.fencing_token,
                    )
                    return
                if verdict is _algorithm.Extension.REFUSED:
                    raise await self._lose(
                        f"lock {self.name!r} is gone from a majority of nodes (expired or taken)",
                        ballot.voted(_algorithm.YES, _algorithm.PENDING),
                    )
                if verdict is _algorithm.Extension.EXPIRED:
                    raise await self._lose(
                        f"lock {self.name!r} could not be extended on a majority before it ran out",
                        self._lease.holders,
                    )
                # RETRY: neither confirmed nor refused (timeouts, errors), and validity is left.
                remaining = self._lease.expires - _clock.now()
                await asyncio.sleep(_algorithm.extend_retry_delay(settings.ttl, settings.node_timeout, remaining))
        except asyncio.CancelledError:
            # Some nodes may have applied the new ttl. If it is shorter than
            # what was left, trust only what it guarantees.
            if self._state is _HELD:
                bound = first_sent + _algorithm.best_validity(ttl_ms / 1000, settings.drift_factor)
                self._lease.expires = min(self._lease.expires, bound)
            raise

    async def _lose(self, why: str, holders: Sequence[int]) -> LockLost:
        """The lease is gone (explicit extend): free what is left of it, and wait for the holders."""
        releases = self._mark_lost(why, holders, wait=True)
        if releases is not None:
            await releases.start().wait()
        assert self._lost is not None
        return self._lost

    def _mark_lost(
        self, why: str, holders: Sequence[int], *, watchdog: bool = False, wait: bool = False
    ) -> Ballot | None:
        """Lost for good: no extension can bring it back. Queue the releases (no await); with *wait*,
        return the ballot (not started) of the nodes that held it, None when none did."""
        assert self._lease.token is not None
        self._state = move(self._state, _LOST)
        self._drop()
        self._lost = LockLost(why, name=self._label, outcomes=self.outcomes)
        wait_for = sorted(set(holders) | set(self._lease.holders)) if wait else []
        releases = (
            Ballot(self._cluster.nodes, vote_of_script, self._settings.node_timeout, majority=False, wait_for=wait_for)
            if wait_for
            else None
        )
        self._send_release(self._lease.token, skip=self._lease.skip, into=releases)
        self._lease.holders = []
        self._emit_lost(why, watchdog=watchdog)
        return releases

    # -- the watchdog's side ------------------------------------------------------
    #
    # Called from the watchdog's task and reply callbacks, never awaited.

    def _next_due(self) -> float:
        """When the watchdog should extend next: a threshold before validity ends, or at the hold limit."""
        settings = self._settings
        return min(
            self._lease.expires - settings.ttl * settings.extend_threshold, self._lease.acquired_at + settings.max_hold
        )

    def _watchdog_due(self, lease: Lease, now: float) -> bool:
        """At a round's start: True to extend now; False when lost (handled here) or no longer watched."""
        if lease is not self._lease or not self._watched or self._state is not _HELD:
            return False
        settings = self._settings
        if now >= self._lease.expires:
            votes = self._last_votes
            if votes and sum(1 for vote in votes if vote is _algorithm.YES) < _algorithm.quorum(len(votes)):
                # The last extension failed (nodes silent or refusing) and its retry came too late.
                self._watchdog_lost(f"lock {self.name!r} could not be extended on a majority before it ran out")
            else:
                # The event loop stalled past the validity (or the process was paused): too late.
                self._watchdog_lost(f"lock {self.name!r} expired before the watchdog could extend it (loop stall?)")
            return False
        if now >= self._lease.acquired_at + settings.max_hold or (
            settings.max_extensions is not None and self._lease.extensions >= settings.max_extensions
        ):
            self._watchdog_lost(f"lock {self.name!r} reached its hold limit (max_hold / max_extensions)")
            return False
        return True

    def _watchdog_result(
        self,
        lease: Lease,
        started: float,
        decided_at: float,
        votes: Sequence[_algorithm.Vote],
        details: Sequence[str] | None,
    ) -> None:
        if lease is not self._lease or not self._watched or self._state is not _HELD or lease.token is None:
            return  # released, lost or re-acquired while the round was out
        settings = self._settings
        self._last_votes, self._last_details = votes, details
        now = _clock.now()
        verdict, validity = _algorithm.judge_extension(
            votes, lease.ttl_ms / 1000, started, decided_at, settings.drift_factor, deadline=lease.expires, now=now
        )
        watchdog = self._cluster.watchdog
        if validity is not None:
            due = self._next_due()
            margin = self._lease.expires - decided_at
            self._lease.expires = decided_at + validity
            self._lease.holders = [i for i, v in enumerate(votes) if v is _algorithm.YES]
            self._lease.extensions += 1
            watchdog.schedule(lease, self._next_due())
            self._emit(
                EventKind.EXTENDED,
                duration=decided_at - started,
                late_by=max(0.0, started - due),
                margin=margin,
                validity=validity,
                fencing_token=self.fencing_token,
                watchdog=True,
            )
            return
        if verdict is _algorithm.Extension.REFUSED:
            self._watchdog_lost(f"lock {self.name!r} is gone from a majority of nodes (expired or taken)")
        elif verdict is _algorithm.Extension.RETRY:
            # Not confirmed, not refused: try again soon, while validity is left.
            retry = _algorithm.extend_retry_delay(settings.ttl, settings.node_timeout, self._lease.expires - now)
            watchdog.retries += 1
            watchdog.schedule(lease, min(now + retry, self._lease.acquired_at + settings.max_hold))
        else:
            self._watchdog_lost(f"lock {self.name!r} could not be extended on a majority before it ran out")

    def _watchdog_lost(self, why: str, *, cause: BaseException | None = None) -> None:
        self._mark_lost(why, (), watchdog=True)
        assert self._lost is not None
        self._lost.__cause__ = cause
        if self.on_lost is not None:
            try:
                self.on_lost(self._lost)
                return
            except Exception:
                # Not told: the body must not run on believing it holds the lock.
                log.exception("redlock %r: on_lost callback failed: cancelling the body", self.name)
        if self._host is not None and not self._host.done():
            self._cancelled_host = True
            self._host.cancel(msg=f"redlock: {why}")

    def on_watchdog_failure(self, exc: BaseException) -> None:
        """Told by the Redlock (not for users): the watchdog stopped on an internal error, so a watched
        lease can no longer be kept."""
        if self._state is not _HELD or not self._watched:
            return
        self._watchdog_lost(
            f"lock {self.name!r} is given up: the watchdog stopped on an internal error "
            f"({type(exc).__name__}: {exc}; its traceback is in the log)",
            cause=exc,
        )

    def on_redlock_closed(self, why: str) -> None:
        """Told by the Redlock (not for users): it closes while this lock is held; release it, and tell
        the holder it is lost."""
        if self._state is not _HELD or self._lease.token is None:
            return
        if self._watched:
            self._watchdog_lost(why)  # the body is cancelled (or on_lost told), as for any loss
        else:
            self._mark_lost(why, ())

    def on_node_lost(self, node: int, why: str) -> None:
        """Told by the Redlock (not for users): node *node*'s clock jumped ahead, so the key may be gone
        there. It no longer counts as a holder. When fewer than a majority of confirmed holders remain,
        the lock is lost at once; inside ``async with``, if nodes whose answer came after the grant (not
        counted, yes or no) could make up the majority, the watchdog extends it at once instead, and that
        round decides."""
        lease = self._lease
        if self._state is not _HELD or lease.token is None:
            return
        votes = self._last_votes
        if node in lease.holders:
            lease.holders = [i for i in lease.holders if i != node]
        elif not (node < len(votes) and votes[node] is _algorithm.PENDING):
            return  # it never counted for this lease
        nodes = self._cluster.nodes
        need = _algorithm.quorum(len(nodes))
        if len(lease.holders) >= need:
            return
        now = _clock.now()
        # Nodes that answered after the grant (their yes not counted) may hold it too, unless their clock jumped.
        late = sum(1 for i, vote in enumerate(votes) if vote is _algorithm.PENDING and nodes[i].clock_held_until <= now)
        if self._watched and len(lease.holders) + late >= need:
            self._cluster.watchdog.schedule(lease, now)
            return
        name = self._cluster.names[node]
        lost = f"lock {self.name!r} is lost: node {name} may have dropped it ({why}); no majority holds it"
        if self._watched:
            self._watchdog_lost(lost)
        else:
            self._mark_lost(lost, ())

    # -- release ----------------------------------------------------------------

    async def release(self) -> None:
        """Delete the lease on every node (only where it is still this acquisition's).

        Returns when the nodes that held it answered, or after the node
        timeout; a node that did not answer keeps the key until it expires.
        Releasing a lost lock does nothing; releasing one that is not held is
        a RuntimeError.
        """
        if self._state is _LOST:
            self._lease.token = None
            return
        if self._state is not _HELD or self._lease.token is None:
            raise RuntimeError(f"release() of lock {self.name!r}, which is not held")
        if self.cooldown is not None:
            # Kept, not deleted: the keys expire `cooldown` s from now (compare-and-PEXPIRE on a majority, or
            # LockLost). Unwatched first, so the watchdog sends no later extension (its rounds out went first).
            self._watched = False
            await self._extend(dataclasses.replace(self._settings, ttl=self.cooldown))
            self._state, self._lease.token, self._lease.holders = move(self._state, _IDLE), None, []
            self._drop()
            self._emit(_RELEASED, duration=0.0, held_for=_clock.now() - self._lease.acquired_at)
            return
        token, holders = self._lease.token, self._lease.holders
        began = _clock.now()
        self._state, self._lease.token, self._lease.holders = move(self._state, _IDLE), None, []
        self._drop()
        self._watched = False  # the watchdog drops it at its next look
        ballot = Ballot(
            self._cluster.nodes, vote_of_script, self._settings.node_timeout, majority=False, wait_for=holders
        )
        if self._next_is_ours(token):
            # The release and the next waiter's round go out in one write per node, in that order.
            nodes = self._cluster.nodes
            for node in nodes:
                node.cork()
            self._send_release(token, skip=self._lease.skip, into=ballot, handed=True)
            self._cluster.listener.hand_over(self._keys[0], released_word(token))
            for node in nodes:
                node.uncork()
        else:
            self._send_release(token, skip=self._lease.skip, into=ballot)
        try:
            await ballot.start().wait()
        except asyncio.CancelledError:
            # The release went out and the lock is no longer held: say so, as for a release waited for.
            self._last_votes, self._last_details = ballot.votes, ballot.details  # so far: the rest pending
            if self._heard(_RELEASED):
                now = _clock.now()
                self._emit(_RELEASED, duration=now - began, held_for=now - self._lease.acquired_at)
            raise
        self._last_votes, self._last_details = ballot.votes, ballot.details
        # Silent otherwise: a node that refuses the script (ACL, renamed EVALSHA) keeps every key until it expires.
        error = _algorithm.ERROR
        if error in ballot.votes and any(ballot.votes[i] is error for i in holders):
            failed = [str(o) for i, o in enumerate(self.outcomes) if i in holders and o.vote is error]
            log.warning("redlock %r not released on %s: the key stays until it expires", self.name, failed)
        if self._heard(_RELEASED):
            now = _clock.now()
            self._emit(_RELEASED, duration=now - began, held_for=now - self._lease.acquired_at)

    # -- async with -------------------------------------------------------------
    #
    # Inside `async with`, the watchdog keeps the lease. If the lease is lost,
    # the body is cancelled the way asyncio.timeout() cancels on expiry: the
    # host task is cancelled, and on the way out that one cancellation (and
    # only that one: the caller's own cancellations pass untouched) becomes
    # LockLost. Timeline of a loss:
    #
    #   body awaits ... watchdog: lost -> keys released, host.cancel()
    #   body gets CancelledError -> __aexit__: uncancel(), raise LockLost

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise not_acquired(
                self._label,
                repr(self.name),
                self._settings.acquire_timeout,
                self._cluster.nodes,
                self._last_votes,
                self._last_details,
            )
        host = asyncio.current_task()
        assert host is not None
        # Held by this task until the lease ends: its nested acquires of the same keys fail at once.
        self._bound = host
        self._cluster.bind(self._keys, host)
        if self._settings.auto_extend:
            self._host, self._host_cancelling, self._cancelled_host = host, host.cancelling(), False
            self._watched = True
            lease = self._lease
            lease.due, lease.result = self._watchdog_due, self._watchdog_result
            self._cluster.watchdog.schedule(lease, self._next_due())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Before any await: from here on the watchdog cannot cancel us.
        host, cancelled_by_us = self._host, self._cancelled_host
        self._unwatch()
        try:
            if cancelled_by_us and host is not None:
                # Our cancel was requested while the body was suspended (callbacks run
                # only then), so it was delivered inside the body: nothing is pending
                # that 3.11 could not withdraw. Take back our count; if the body let
                # the CancelledError out and no one else cancelled, it becomes LockLost.
                others = host.uncancel() > self._host_cancelling
                if exc_type is asyncio.CancelledError and not others:
                    await self._cluster.watchdog.forget(self._lease)
                    assert self._lost is not None
                    raise self._lost from (self._lost.__cause__ or exc)
            # Our clock says the validity ran out while the body ran (a blocked loop,
            # or many holders exiting at once): the nodes decide whether it was lost.
            overran = host is not None and self._state is _HELD and _clock.now() >= self._lease.expires
            cleanup = self._cleanup(exc, overran, watched=host is not None)
            if overran or exc_type is asyncio.CancelledError:
                # Deciding a loss, or leaving a cancelled scope (anyio cancels again at every await):
                # the confirmation, the state and the lost event must not be cut short.
                await complete(cleanup)
            else:
                await cleanup
        finally:
            if self._bound is not None:  # the lease ended in there (that unbinds it); this is for a failed exit
                self._cluster.unbind(self._keys, self._bound)
                self._bound = None

    async def _cleanup(self, exc: BaseException | None, overran: bool, *, watched: bool) -> None:
        try:
            await self._exit(exc, overran, watched=watched)
        finally:
            if watched:
                # After the release went out: stopping the watchdog's task must not delay the hand-off.
                await self._cluster.watchdog.forget(self._lease)

    async def _exit(self, exc: BaseException | None, overran: bool, *, watched: bool) -> None:
        """Release on the way out of ``async with``; raise LockLost if the lock was lost while watched."""
        if self._state is _HELD and overran and self.cooldown is None:  # with a cooldown: release() tells
            confirmed, holders = await self._release_confirmed()
            if confirmed:
                return  # a majority still held our key at release: no one else can have held it
            self._state = move(self._state, _LOST)
            self._drop()
            self._lost = LockLost(
                f"lock {self.name!r} ran out while the body ran" + self._overrun_cause(holders),
                name=self._label,
                outcomes=self.outcomes,
            )
            self._emit_lost(str(self._lost.args[0]), watchdog=True)
        if self._state is _LOST:
            self._lease.token = None
            if exc is None and watched and self.on_lost is None:
                assert self._lost is not None
                raise self._lost  # the body finished, but not under the lock the whole time
            return
        if self._state is not _HELD:
            return  # released by the body itself
        try:
            await self.release()
        except Exception:
            # Never let a release problem mask what the body raised.
            if exc is None:
                raise
            log.exception("redlock %r: release failed after the body raised", self.name)

    def _overrun_cause(self, holders: Sequence[int]) -> str:
        """Why an overrun lease was not confirmed at release: the nodes were silent, or the key was gone."""
        votes = self._last_votes
        silent = [i for i in holders if votes[i] not in (_algorithm.YES, _algorithm.NO)]
        if len(silent) > len(holders) - _algorithm.quorum(len(votes)):
            return (
                f": {len(silent)} of the {len(holders)} nodes that held it did not answer the release "
                "(nodes unreachable: the watchdog could not extend it either)"
            )
        return ": the key was gone from the nodes that held it (the event loop blocked past the validity?)"

    async def _release_confirmed(self) -> tuple[bool, list[int]]:
        """Release, and tell whether our key was still on a majority of the nodes that held it throughout.

        Only nodes that said yes at the grant (or the last extension) count: a SET of the same
        acquisition still in flight at the grant (held by a partition that healed later) can
        re-create our key on another node after someone else held the lock meanwhile, so our
        key there at release proves nothing.
        """
        assert self._lease.token is not None
        token, holders = self._lease.token, self._lease.holders
        self._lease.token, self._lease.holders = None, []
        # The question is only whether those nodes still held our key when the release
        # ran; a busy loop may read the answers late, so wait for them up to a connect timeout.
        settings = self._settings
        nodes = self._cluster.nodes
        wait = max(settings.node_timeout, settings.connect_timeout)
        ballot = Ballot(nodes, vote_of_script, wait, majority=False, wait_for=holders, rearm=settings.node_timeout)
        self._send_release(token, skip=self._lease.skip, into=ballot)
        await ballot.start().wait()
        self._last_votes, self._last_details = ballot.votes, ballot.details
        kept = sum(1 for i in holders if ballot.votes[i] is _algorithm.YES)
        confirmed = kept >= _algorithm.quorum(len(nodes))
        if confirmed:
            self._state = move(self._state, _IDLE)
            self._drop()
            now = _clock.now()
            self._emit(_RELEASED, duration=now - ballot.decided_at, held_for=now - self._lease.acquired_at)
        return confirmed, holders

    # -- events -------------------------------------------------------------------

    def _heard(self, kind: EventKind) -> bool:
        """True when an event of *kind* is logged or handed to on_event (else it need not be made)."""
        return self._cluster.on_event is not None or log.isEnabledFor(
            logging.WARNING if kind is _LOST_EVENT else logging.DEBUG
        )

    def _emit(self, kind: EventKind, **fields: Any) -> None:
        """Log the event (DEBUG; WARNING for a loss) and hand it to the Redlock's on_event."""
        hook = self._cluster.on_event
        level = logging.WARNING if kind is _LOST_EVENT else logging.DEBUG
        logged = log.isEnabledFor(level)
        if hook is None and not logged:
            return
        cluster, details = self._cluster, self._last_details
        quarantined: tuple[str, ...] = ()
        for node in cluster.nodes:
            if node.quarantined_until and sitting_out(node):
                quarantined += (node.name,)
        event = LockEvent(
            kind,
            self._label,
            grant=None if kind is _NOT_ACQUIRED else self._lease.serial,
            quarantined=quarantined,
            nodes=cluster.names,
            votes=tuple(self._last_votes),
            details=None if details is None else tuple(details),
            **fields,
        )
        if logged:
            log.log(level, "%s", event, extra={"redlock": event.fields()})
        if hook is not None:
            try:
                hook(event)
            except Exception:
                log.exception("redlock %r: on_event callback failed", self.name)

    def _emit_lost(self, why: str, *, watchdog: bool) -> None:
        self._emit(EventKind.LOST, held_for=_clock.now() - self._lease.acquired_at, reason=why, watchdog=watchdog)

    def _unwatch(self) -> None:
        self._watched = False
        self._host, self._cancelled_host = None, False
        self._cluster.watchdog.discard(self._lease)

    @property
    def resource(self) -> Name | tuple[Name, ...]:
        """Deprecated spelling of :attr:`name`."""
        renamed("Lock.resource", ".name")
        return self.name

    @property
    def _label(self) -> str:
        if isinstance(self.name, tuple):
            return "+".join(name if isinstance(name, str) else repr(name) for name in self.name)
        return self.name if isinstance(self.name, str) else repr(self.name)
