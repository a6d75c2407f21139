"""How a lock is taken: one acquire strategy per primitive.

A strategy knows its lock's keys on the nodes and how to take them, wait for them and give them
back; the lock's :class:`~redlock_async._rounds._lease.Tenure` is where it records what happened (the
attempts, the last votes, the grant). A ``Lock`` front is given one at construction:

==============  ==========================================================================
:class:`Words`  one name: SET NX PX on every node; a waiter listens for release words, and a
                release of this Redlock may hand the lock over (send the waiter's round)
:class:`Many`   several names (``lock_many``), all or none; a waiter listens on the name its
                last try found held
:class:`Queued` one name or several through the nodes' grant queue (``queue=True``, the
                default; docs/algorithm.md): a lock's first try, ``_in_line``'s wait
:class:`Permit` a semaphore's permit: a slot of the name, each slot a mutex (``_semaphore.py``)
==============  ==========================================================================

A new primitive (a reader/writer lock) is a new strategy meeting :class:`Strategy`, given to a
``Lock`` front: what the front, its keeper and its guard ask of a strategy, and nothing else.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Sequence
from typing import Protocol

from redlock_async._core import Name, Settings, default_owner, fence_key, released_word, resource_key
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._core import lot as _lot
from redlock_async._lock._in_line import line_token, never_refused, wait_in_line
from redlock_async._queue import claim as _queue
from redlock_async._queue import release as _queue_release
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Ballot, Keep, Lease, Phase, Tenure, back_in, outcomes
from redlock_async._rounds import requests as _requests
from redlock_async._shared import Cluster
from redlock_async._shared import handoff as _handoff

log = logging.getLogger("redlock_async.lock")

_ACQUIRING, _HELD, _IDLE = Phase.ACQUIRING, Phase.HELD, Phase.IDLE  # module globals: see lock.py's note

_random = random.SystemRandom()


class Strategy(Protocol):
    """How one lock is taken and given back: what its front, keeper and guard ask of it."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The keys the lock's task is bound to inside ``async with`` (and nested acquires look at)."""

    @property
    def names(self) -> tuple[Name, ...]:
        """The names, in the order they are taken."""

    @property
    def owner(self) -> bytes | None:
        """The owner label stored with the keys (None: the default, ``<hostname>:<pid>``)."""

    @property
    def permits(self) -> int:
        """How many holds of its key one task may have before asking for another would wait for itself."""

    def held_words(self, name: Name) -> str:
        """What a task already holds, in words, for NestedAcquire."""

    async def acquire(self, tenure: Tenure, blocking: bool, give_up: float) -> bool:
        """Take the lock for *tenure* (ACQUIRING: to HELD when True, IDLE otherwise) by *give_up*."""

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        """Queue the release of *lease* (token *token*) on every node but *skip*, now (synchronous)."""

    def next_is_ours(self, token: bytes) -> bool:
        """True when the release of *token* may hand the lock over (:meth:`hand_over`)."""

    def hand_over(self, token: bytes) -> None:
        """Send the next waiter's round right behind the release of *token*."""


class Words:
    """One name: a round of SET NX PX (fenced: and its fence) on every node, retried after a jittered
    delay; a blocking waiter listens for the release words of the key and waits in this process's
    line, and a release of this Redlock may send the oldest waiter's round right behind it."""

    __slots__ = ("_leave", "blocked", "cluster", "fence_keys", "keys", "name", "names", "owner", "settings")

    permits = 1
    """How many holds of its key one task may have before asking for another would wait for itself."""

    takes_hand_over = True
    """A release of this Redlock may send this lock's next round (see :meth:`presend`)."""

    marks = True
    """Its channels are lock keys, whose releases speak only where a listener marked them (``QUEUE_LEAVE``):
    subscribing sets the mark (a semaphore's or a read/write lock's releases always speak)."""

    def __init__(
        self, cluster: Cluster, settings: Settings, names: tuple[Name, ...], owner: bytes | None, name: object
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.names = names
        self.owner = owner
        self.name = name
        """The lock's name (or names), for messages."""
        self.keys = tuple(resource_key(settings.key_prefix, one) for one in names)
        self.fence_keys = tuple(
            fence_key(settings.fence_prefix, one, key if cluster.one_slot else None)
            for one, key in zip(names, self.keys, strict=True)
        )
        self.blocked = self.keys[0]
        """The key a failed attempt found held: the one its waiter listens on."""
        self._leave: _queue_release.Leave | None = None  # Queued: its release, packed once up to the token

    def held_words(self, name: Name) -> str:
        """What the task already holds, in words, for NestedAcquire."""
        return f"lock {name!r}"

    async def acquire(self, tenure: Tenure, blocking: bool, give_up: float) -> bool:
        """Take the lock for *tenure* (ACQUIRING; HELD when True, IDLE otherwise) by *give_up*."""
        cluster = self.cluster
        listener = cluster.listener if self.settings.wait_for_release and blocking else None
        listening = woken = attempted = False
        place = _lot.ticket()
        try:
            # Try at once (the key may be free while waiters of this process wait for their timers),
            # unless the line is taking it now or a lock of this Redlock holds it: then join the line.
            channel = self.blocked
            in_line = (
                listener is not None
                and listener.waiting(channel)
                and (listener.taking(channel) or len(cluster.bound.get(channel, ())) >= self.permits)
            )
            while True:
                if not in_line:
                    attempted = True
                    if await self.attempt(tenure):
                        return True
                remaining = give_up - _clock.now()
                # Never give up without one attempt: a blocking acquire does no worse than blocking=False.
                if not blocking or (remaining <= 0 and attempted):
                    return False
                delay = _algorithm.retry_delay(self.settings.retry_delay, _random.random(), max(remaining, 0.0))
                delay = min(delay, back_in(cluster.nodes))  # a node back from its quarantine: look then
                if listener is None:
                    await cluster.pause(delay)
                else:
                    if listening and self.blocked != channel:
                        # lock_many: its last attempt found another name held. Listen for that
                        # one's release instead, keeping our ticket (our place in its line).
                        if woken:
                            listener.done(channel)
                        listener.depart(channel, place)
                        listener.unsubscribe(channel)
                        listening = woken = False
                    if not listening:
                        listening = True
                        # Listen first, then look again: a release between the failed attempt
                        # and a new subscription would otherwise go unheard. An existing
                        # subscription already heard it, and woke the oldest waiter.
                        channel = self.blocked  # lock_many: the key its last attempt found held
                        if (
                            await listener.subscribe(channel, mark=self.marks)
                            and not in_line
                            and await self.attempt(tenure)
                        ):
                            return True
                    # Woken by a release (our turn among this process's waiters), or after
                    # the jittered delay if no word came: notifications can be lost. A release
                    # of this Redlock may have sent our next round already (handed it over).
                    taker = _handoff.Taker(self.presend, self.give_back) if self.takes_hand_over else None
                    woken = await listener.wait(channel, delay, place, again=woken, taker=taker)
                    tenure.woke(_clock.now() if woken else None)  # the hand-off latency starts here
                    in_line = False
                    if woken and (sent := listener.handed(channel, place)) is not None:
                        attempted = True
                        if await self.attempt(tenure, sent):
                            return True
                        in_line = True  # that was this wake-up's try: wait again
                # Closed meanwhile, or a background task failed: say so now, not at the timeout.
                cluster.check_open()
                if _clock.now() >= give_up and attempted:
                    return False
        finally:
            if tenure.phase is _ACQUIRING:
                tenure.to(_IDLE)
            if listening and listener is not None:
                if woken:
                    listener.done(channel)  # the next release wakes the next waiter
                listener.depart(channel, place)
                listener.unsubscribe(channel)

    async def attempt(self, tenure: Tenure, sent: _requests.Sent | None = None) -> bool:
        """One round on all nodes (*sent* already, by a releaser handing the lock over); True when a
        majority granted a valid lease (then *tenure* holds it)."""
        result = await self.take(sent)
        if result.validity is None:
            tenure.tried()
            tenure.heard(result)
            self.cluster.listener.gives_back(result.token)  # its give-back's words wake none of ours
            if log.isEnabledFor(logging.DEBUG):
                found = outcomes(self.cluster.nodes, result.votes, result.details)
                log.debug("redlock %r not acquired: %s", self.name, ", ".join(map(str, found)))
            return False
        tokens = result.fencing_tokens
        settings = self.settings
        lease = Lease(
            result.keys,
            result.token,
            ttl_ms=settings.ttl_ms,
            acquired_at=result.started,
            expires=result.decided_at + result.validity,
            holders=result.holders,
            skip=result.skip,
            fencing_token=tokens[0] if tokens else None,
            fencing_tokens=tokens,
            keeps=result.keeps,
            fence_keys=self.fence_keys if tokens else (),
            fence_ttl_ms=settings.fence_ttl_ms,
            late=result.late,
            takes=result.takes,
        )
        tenure.grant(lease, result, 1)
        return True

    def take(self, sent: _requests.Sent | None = None) -> Awaitable[_requests.Attempt]:
        """One round for every key of this lock (all or none). (Returns ``decide``'s coroutine, not one of its
        own: one coroutine less between the task and the round's future, on each of its wake-ups.)"""
        return _requests.decide(self.cluster.nodes, self.keys, self.fence_keys, self.settings, sent or self.presend())

    def presend(self) -> _requests.Sent:
        """Send this lock's next round now (synchronous): a release of this Redlock hands the lock over
        to its oldest waiter by queueing the waiter's round right behind the release on every node."""
        cluster = self.cluster
        clock = cluster.clock  # (cluster.reading(), inlined: once per round)
        return _requests.send_attempt(
            cluster.nodes,
            self.keys,
            self.fence_keys,
            self.settings,
            self.owner or default_owner(),
            None if clock is None else clock.reading(),
        )

    def give_back(self, sent: _requests.Sent) -> None:
        """A round sent for this lock that its waiter will never count (cancelled in the same loop turn)."""
        _requests.give_back(self.cluster.nodes, self.keys, sent)

    def next_is_ours(self, token: bytes) -> bool:
        """True when a release of this lock may hand it over: the next in line for its key is a waiter
        of this Redlock (then the release sends that waiter's round right behind it)."""
        return self.settings.wait_for_release and self.cluster.listener.may_hand_over(
            self.keys[0], released_word(token)
        )

    def hand_over(self, token: bytes) -> None:
        """Send the next waiter's round, right behind the release of *token* (see :meth:`next_is_ours`)."""
        self.cluster.listener.hand_over(self.keys[0], released_word(token))

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        """Queue compare-and-delete of *lease*'s keys on every node but *skip* (synchronous: survives
        cancellation)."""
        _requests.send_release(self.cluster.nodes, lease.keys, token, skip, into=into, handed=handed)


class Many(Words):
    """Several names (``lock_many``), taken all at once or not at all."""

    __slots__ = ()

    async def take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        keys = self.keys
        result = await _requests.decide(
            self.cluster.nodes, keys, self.fence_keys, self.settings, sent or self.presend()
        )
        if result.codes:
            # The key most of the refusing nodes found held: a waiter listens for its release.
            self.blocked = keys[max(set(result.codes), key=result.codes.count) * -1 - 1]
        return result

    def next_is_ours(self, token: bytes) -> bool:
        return False  # a release hands over single locks only: the waiters of one name of several wake and try


class Queued(Words):
    """One name or several (``lock_many``) through the nodes' grant queue (``queue=True``, the default;
    docs/algorithm.md): a lock's first try, waiting in line (:func:`~._in_line.wait_in_line`)."""

    __slots__ = ()

    acquire = wait_in_line
    new_token = line_token
    check_refused = never_refused

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        """One claim per name, with one score (its place in every line) and one bell."""
        score, bell = _queue.new_score(), _queue.Bell()
        nodes, settings = self.cluster.nodes, self.settings
        return [
            _queue.Claim(nodes, key, settings, token, fence_key, score=score, bell=bell, guard=self.cluster.clock)
            for key, fence_key in zip(self.keys, self.fence_keys, strict=True)
        ]

    keeps: Keep | None = None  # (InLine's fields: see there)
    regains = True

    @property
    def channels(self) -> tuple[bytes, ...]:
        """Where the claims' grant words are published: the lock keys (a read/write lock's: its writer key)."""
        return self.keys

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        """The keys a won claim holds: the lock's (a semaphore's: the slot a majority granted)."""
        return self.keys

    def next_is_ours(self, token: bytes) -> bool:
        return False  # the nodes hand the key on (the release script grants the first in line)

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        nodes = self.cluster.nodes  # to each key's next waiter
        if len(self.keys) == 1:
            leave = self._leave
            if leave is None or leave.key != lease.keys[0]:
                leave = self._leave = _queue_release.Leave(lease.keys[0], self.fence_keys[0])
            leave.send(nodes, token, into, skip)
        else:
            _queue_release.release_all(nodes, lease.keys, self.fence_keys, token, into, skip)
