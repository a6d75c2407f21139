"""Waiting in the grant queue: one of the two ways a strategy waits (the other: release words, ``Words.acquire``).

A strategy is what a primitive takes (``Words``, ``Many``, ``Permit``, ``Reader``, ``Writer``: its first
try, its keys) and how it waits. One that waits in the nodes' lines (``queue=True``, the default) names
:func:`wait_in_line` as its ``acquire`` and gives what :class:`InLine` lists: its claims (one per name, in
its primitive's line: ``_queue``'s ``Line``), their token, the keys a won claim holds. Composed, not
inherited: ``Queued``, ``QueuedPermit``, ``QueuedReader`` and ``QueuedWriter`` each extend their
primitive's strategy alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from redlock_async._core import Settings, default_owner
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._queue import claim as _queue
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Heard, Keep, Lease, Phase, Tenure, back_in
from redlock_async._rounds import requests as _requests
from redlock_async._shared import Cluster

_ACQUIRING, _HELD, _IDLE = Phase.ACQUIRING, Phase.HELD, Phase.IDLE  # module globals: see lock.py's note

_random = random.SystemRandom()


class InLine(Protocol):
    """What :func:`wait_in_line` asks of a strategy that waits in the grant queue."""

    cluster: Cluster
    settings: Settings
    owner: bytes | None
    marks: bool
    """Its channels are lock keys: subscribing sets their listening marks (``Listener.subscribe``)."""

    @property
    def fence_keys(self) -> tuple[bytes, ...]:
        """Per key, its fencing counter (fenced locks; else empty)."""

    @property
    def channels(self) -> tuple[bytes, ...]:
        """Where the claims' grant words are published."""

    @property
    def keeps(self) -> Keep | None:
        """A key the lease's extensions keep alive beside its own (a semaphore's widest-limit key), or a
        reader's own extension of its entry in the readers' hash (``Keep.instead``)."""

    @property
    def regains(self) -> bool:
        """A won claim's lease takes its key where it is free on the nodes that did not grant it (a
        read/write lock's: never, a SET there would skip the rule on one node)."""

    async def attempt(self, tenure: Tenure, sent: _requests.Sent | None = None) -> bool:
        """The first try, the primitive's own round."""

    def new_token(self) -> bytes:
        """The token of one acquire's claims (the same in every line it enters)."""

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        """The acquire's claims: one per name, in its primitive's line."""

    def check_refused(self, claims: Sequence[_queue.Claim]) -> None:
        """Raise when the nodes refused the claims for good (a semaphore's other limit)."""

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        """The keys a won claim holds."""


async def wait_in_line(self: InLine, tenure: Tenure, blocking: bool, give_up: float) -> bool:
    """``acquire`` in the grant queue. The first try is the strategy's own ``attempt`` (a lock's: SET NX,
    or fenced, ACQUIRE_FENCED and its fence; lock_many: ACQUIRE_ALL): uncontended, the queue costs nothing
    more. A try that finds a key held joins the lines with one claim per name (one token, one place in
    every line), entered on every node at each try, held once a majority holds every key for its token,
    whether a node set it at once or granted it later (a release handing it on): ``_queue``'s ``wait``."""
    cluster = self.cluster
    listener = cluster.listener
    settings = self.settings
    nodes = cluster.nodes
    # Empty tuples till the first try fails (uncontended, no list lives across its await), and no
    # comprehension below names a local (each made it a cell, on every acquire).
    claims: Sequence[_queue.Claim] = ()
    subscribed: Sequence[bytes] = ()
    done = False
    try:
        if await self.attempt(tenure) or not blocking or _clock.now() >= give_up:
            done = True
            return tenure.phase is _HELD
        token = self.new_token()
        claims = entered = []
        for claim in self.new_claims(token):
            entered.append(claim)
            listener.grants.expect(
                claim.keys[0], claim
            )  # before our first entry: a grant word heard from then on is ours
        # Each node's confirmation of a subscription made after our entry pokes the claim: a grant
        # published before it went unheard, so we enter again at once.
        subscribed = joined = []
        for key in self.channels:
            joined.append(key)
            await listener.subscribe(key, mark=self.marks)
        # A name held while another is not is given back after about a retry delay (lock_many).
        grace = _queue.patience(nodes, settings.node_timeout)
        hold_back = max(grace, settings.retry_delay)
        while True:
            cluster.check_open()  # a background task failed (the subscribers'?): say so now
            tenure.tried()
            _queue_wait.join(claims)
            # One try: until a majority holds every key for us, or every node answered (or timed out).
            grace = _queue.patience(nodes, settings.node_timeout)
            won = await _queue_wait.claimed(claims, _clock.now() + grace, grace, hold_back, until_answered=True)
            self.check_refused(claims)
            now = _clock.now()
            if won is None and now < give_up:
                # Wait in line: grant words (a release handing the key on) until the next try.
                delay = _algorithm.retry_delay(settings.retry_delay, _random.random(), give_up - now)
                delay = min(delay, back_in(nodes))  # a node back from its quarantine: look then
                won = await _queue_wait.claimed(claims, now + delay, grace, hold_back, until_answered=False)
                if won is not None:
                    listener.granted()  # a release handed it to us, not our fallback timer
                    # The hand-off latency starts at the first grant heard of the nodes that count.
                    tenure.woke(_first_grant(claims, won))
            if won is not None:
                done = True
                _take_claim(self, tenure, token, won)
                return True
            cluster.check_open()  # closed meanwhile, or a background task failed: say so now
            if _clock.now() >= give_up:
                done = True
                tenure.heard(Heard(*_queue_wait.votes(claims, _clock.now(), grace)))  # before leave()
                _queue_wait.quit(claims)  # out of every line, and whatever a node granted us goes on
                await _queue_wait.settled(claims, _queue.patience(nodes, settings.node_timeout))
                return False
    finally:
        if tenure.phase is _ACQUIRING:
            tenure.to(_IDLE)
        for claim in claims:
            listener.grants.unexpect(claim.keys[0], claim)
        if not done:
            _queue_wait.quit(claims)  # cancelled, or failed: queued now, before the exception goes on
        for key in subscribed:
            listener.unsubscribe(key)


def _first_grant(claims: Sequence[_queue.Claim], won: _queue_wait.Won) -> float:
    """When the first grant of the nodes that count was heard."""
    return min(claim.since[i] for claim in claims for i in won.holders)


def _take_claim(self: InLine, tenure: Tenure, token: bytes, won: _queue_wait.Won) -> None:
    """The won claims' grant, made the lease of *tenure* (HELD)."""
    n = len(self.cluster.nodes)
    yes, pending = _algorithm.YES, _algorithm.PENDING  # the others may grant it later
    holders = won.holders
    tokens = won.fencing_tokens
    lease = Lease(
        self.lease_keys(won), token, ttl_ms=self.settings.ttl_ms, acquired_at=won.at, expires=won.end,
        holders=holders, skip=(), fencing_token=None if tokens is None else tokens[0],
        fencing_tokens=tokens, keeps=self.keeps,
        fence_keys=() if tokens is None else self.fence_keys, fence_ttl_ms=self.settings.fence_ttl_ms,
        regain=[i for i in range(n) if i not in holders] if self.regains else [], takes=self.regains,
    )  # fmt: skip
    tenure.grant(lease, Heard([yes if i in holders else pending for i in range(n)], None), 0)


def line_token(self: InLine) -> bytes:
    """``new_token`` of most strategies in line: a random token with the owner label."""
    return _requests.new_token(self.owner or default_owner())


def never_refused(self: InLine, claims: Sequence[_queue.Claim]) -> None:
    """``check_refused`` of a lock's claims: the nodes never refuse them for good."""
