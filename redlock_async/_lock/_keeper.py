"""Keeping a held lease: extending it (``extend()`` and the watchdog's rounds alike), losing it,
releasing it, and what the Redlock tells a held lock.

What follows an extension's verdict is decided once, by :func:`~redlock_async._rounds._judge.after_extension`;
the phase changes (and all they imply) are :meth:`~redlock_async._rounds._lease.Tenure.to`'s. The
watchdog's side (:meth:`Keeper.due`, :meth:`Keeper.result`) is called from its task and reply
callbacks, never awaited.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

from redlock_async._core import Settings
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._lock._emitter import emit, emit_lost, heard
from redlock_async._lock._strategies import Strategy
from redlock_async._nodes import Failure
from redlock_async._rounds import (
    RAN_OUT,
    UNANSWERED,
    Ballot,
    Heard,
    Lease,
    Phase,
    Tenure,
    after_extension,
    outcomes,
    vote_of_script,
)
from redlock_async._rounds import requests as _requests
from redlock_async._shared import Cluster
from redlock_async.errors import LockLost, NodeOutcome, ReleaseFailed
from redlock_async.events import EventKind

log = logging.getLogger("redlock_async.lock")

# Module globals (see lock.py's note on Enum members).
_IDLE, _HELD, _LOST = Phase.IDLE, Phase.HELD, Phase.LOST
_EXTENDED, _RELEASED = EventKind.EXTENDED, EventKind.RELEASED
_CONFIRMED, _RETRY, _REFUSED = _algorithm.Extension.CONFIRMED, _algorithm.Extension.RETRY, _algorithm.Extension.REFUSED
_YES, _PENDING, _ERROR = _algorithm.YES, _algorithm.PENDING, _algorithm.ERROR


class Successor(Protocol):
    """The lock a lease is handed over to (a downgrade's reader): what an extension of the old lease does."""

    async def extend(self, ttl: float | None = None) -> None: ...


Handover: TypeAlias = "tuple[Lease, asyncio.Future[bool | None], Successor]"
"""A lease handed over, its verdict (True: the successor holds; False: lost; None: given up) and the successor."""


class Keeper:
    """The held side of one lock: extension, loss, release, and the watchdog's hooks."""

    __slots__ = ("__weakref__", "cluster", "handover", "name", "settings", "strategy", "tenure")

    def __init__(
        self,
        strategy: Strategy,
        cluster: Cluster,
        settings: Settings,
        name: object,
        label: str,
        on_lost: Callable[[LockLost], object] | None,
    ) -> None:
        self.name = name
        """The lock's name (or names), for messages."""
        self.tenure = Tenure(cluster, self, strategy.keys, name, label, on_lost)
        """The lock's life; this keeper is what its Redlock keeps (and tells things) while it is held."""
        self.strategy = strategy
        self.cluster = cluster
        self.settings = settings
        self.handover: Handover | None = None
        """The lease being (or last) handed over to another lock in one step on the nodes (a downgrade)."""

    @property
    def held(self) -> bool:
        """Held now, validity left (``Lock.held``)."""
        tenure = self.tenure
        return tenure.phase is _HELD and _clock.now() < tenure.lease.expires

    def _gone(self) -> LockLost:
        tenure = self.tenure
        return tenure.lost or LockLost(f"lock {tenure.name!r} was lost", name=tenure.label)

    # -- extend ----------------------------------------------------------------------

    async def extend(self, settings: Settings) -> None:
        """``extend()`` to *settings*' ttl (a cooldown's too, which is no lease for the restart quarantine)."""
        tenure = self.tenure
        nodes = self.cluster.nodes
        token = tenure.lease.token
        assert token is not None  # held: the callers checked
        ttl_ms = settings.ttl_ms
        first_sent = _clock.now()
        try:
            while True:
                lease = tenure.lease
                if (handover := self.handover) is not None and handover[0] is lease:
                    return await self._follow(settings, handover)
                if tenure.phase is not _HELD or lease.token != token:
                    # Lost (the watchdog, or the Redlock closed) or released during our retry's sleep:
                    # an extension now would take free nodes for a lease no one holds.
                    raise self._gone()
                started = _clock.now()
                if started >= lease.expires:
                    raise await self.lose(f"lock {tenure.name!r} {RAN_OUT}", lease.holders)
                # Votes after the old validity ends prove nothing: stop waiting then.
                timeout = min(settings.node_timeout, lease.expires - started)
                ballot = _requests.send_extend(nodes, lease, ttl_ms, timeout, self.cluster.reading())
                if lease.keeps is not None:
                    _requests.send_keep(nodes, lease.keys[0], lease.keeps, token, ttl_ms)
                await ballot.wait()
                tenure.heard(ballot)
                if (handover := self.handover) is not None and handover[0] is lease:
                    # Handed over while out: a node that did the swap first refused it, though nothing was lost.
                    return await self._follow(settings, handover)
                if tenure.phase is not _HELD or tenure.lease.token != token:
                    # The watchdog declared it lost (or the Redlock closed) while we waited.
                    raise self._gone()
                lease.regain, lease.late = [], _requests.answers(ballot)
                judged = after_extension(
                    lease, settings, ttl_ms, ballot.votes, started, ballot.decided_at, _clock.now()
                )
                if judged.verdict is _CONFIRMED:
                    emit(
                        self.cluster,
                        tenure,
                        _EXTENDED,
                        duration=ballot.decided_at - first_sent,
                        margin=judged.margin,
                        validity=judged.validity,
                        fencing_token=lease.fencing_token,
                    )
                    return
                if judged.verdict is _RETRY:
                    await asyncio.sleep(judged.retry_in)
                    continue
                # Lost: wait for the nodes that may hold it (refused: those that said yes or did not say).
                holders = ballot.voted(_YES, _PENDING) if judged.verdict is _REFUSED else lease.holders
                raise await self.lose(f"lock {tenure.name!r} {judged.why}", holders)
        except asyncio.CancelledError:
            # Some nodes may have applied the new ttl. If it is shorter than
            # what was left, trust only what it guarantees.
            if tenure.phase is _HELD:
                bound = first_sent + _algorithm.best_validity(ttl_ms / 1000, settings.drift_factor)
                tenure.lease.expires = min(tenure.lease.expires, bound)
            raise

    async def _follow(self, settings: Settings, handover: Handover) -> None:
        """An extension of a lease handed over (or being handed over): the hand-over's verdict decides. Done,
        the extension goes to the successor's lease, which holds in its place; failed, the lease is lost."""
        _, verdict, successor = handover
        # Shielded: the verdict is the hand-over's, which a cancelled extension must not cancel.
        if await asyncio.shield(verdict):
            await successor.extend(settings.ttl)
            return
        if verdict.result() is None:
            name = self.tenure.name
            raise RuntimeError(f"extend() of lock {name!r}, which was released: its downgrade was cancelled")
        raise self._gone()

    async def lose(self, why: str, holders: Sequence[int]) -> LockLost:
        """The lease is gone (explicit extend): free what is left of it, and wait for the holders."""
        releases = self.mark_lost(why, holders, wait=True)
        if releases is not None:
            await releases.start().wait()
        assert self.tenure.lost is not None
        return self.tenure.lost

    def mark_lost(
        self, why: str, holders: Sequence[int], *, watchdog: bool = False, wait: bool = False
    ) -> Ballot | None:
        """Lost for good: no extension can bring it back. Queue the releases (no await); with *wait*,
        return the ballot (not started) of the nodes that held it, None when none did."""
        tenure = self.tenure
        lease = tenure.lease
        assert lease.token is not None
        lost = LockLost(why, name=tenure.label, outcomes=self.outcomes())
        wait_for = sorted(set(holders) | set(lease.holders)) if wait else []
        releases = (
            Ballot(self.cluster.nodes, vote_of_script, self.settings.node_timeout, majority=False, wait_for=wait_for)
            if wait_for
            else None
        )
        self.strategy.send_release(lease, lease.token, lease.skip, into=releases)
        tenure.to(_LOST, lost)
        emit_lost(self.cluster, tenure, why, watchdog=watchdog)
        return releases

    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node outcomes of the last request (NodeOutcomes)."""
        tenure = self.tenure
        return outcomes(self.cluster.nodes, tenure.votes, tenure.details) if tenure.votes else ()

    # -- the watchdog's side -------------------------------------------------------------

    def next_due(self) -> float:
        """When the watchdog should extend next: a threshold before validity ends, or at the hold limit."""
        settings, lease = self.settings, self.tenure.lease
        return min(lease.expires - settings.ttl * settings.extend_threshold, lease.acquired_at + settings.max_hold)

    def due(self, lease: Lease, now: float) -> bool:
        """At a round's start: True to extend now; False when lost (handled here) or no longer watched."""
        tenure = self.tenure
        if lease is not tenure.lease or not tenure.watched or tenure.phase is not _HELD:
            return False
        settings = self.settings
        name = tenure.name
        if now >= lease.expires:
            votes = tenure.votes
            if votes and sum(1 for vote in votes if vote is _YES) < _algorithm.quorum(len(votes)):
                # The last extension failed (nodes silent or refusing) and its retry came too late.
                self.lose_watched(f"lock {name!r} {RAN_OUT}")
            else:
                # The event loop stalled past the validity (or the process was paused): too late.
                self.lose_watched(f"lock {name!r} expired before the watchdog could extend it (loop stall?)")
            return False
        if now >= lease.acquired_at + settings.max_hold or (
            settings.max_extensions is not None and lease.extensions >= settings.max_extensions
        ):
            self.lose_watched(f"lock {name!r} reached its hold limit (max_hold / max_extensions)")
            return False
        return True

    def result(
        self,
        lease: Lease,
        started: float,
        decided_at: float,
        votes: Sequence[_algorithm.Vote],
        details: Sequence[str] | None,
    ) -> None:
        """The watchdog's round for *lease* was decided: what follows (:func:`after_extension`)."""
        tenure = self.tenure
        if lease is not tenure.lease or not tenure.watched or tenure.phase is not _HELD or lease.token is None:
            return  # released, lost or re-acquired while the round was out
        settings = self.settings
        tenure.heard(Heard(votes, details))
        now = _clock.now()
        due = self.next_due()
        judged = after_extension(lease, settings, lease.ttl_ms, votes, started, decided_at, now)
        watchdog = self.cluster.watchdog
        if judged.verdict is _CONFIRMED:
            lease.extensions += 1
            watchdog.schedule(lease, self.next_due())
            emit(
                self.cluster,
                tenure,
                _EXTENDED,
                duration=decided_at - started,
                late_by=max(0.0, started - due),
                margin=judged.margin,
                validity=judged.validity,
                fencing_token=lease.fencing_token,
                watchdog=True,
            )
        elif judged.verdict is _RETRY:
            # Not confirmed, not refused: try again soon, while validity is left.
            watchdog.retries += 1
            watchdog.schedule(lease, min(now + judged.retry_in, lease.acquired_at + settings.max_hold))
        else:
            self.lose_watched(f"lock {tenure.name!r} {judged.why}")

    def lose_watched(self, why: str, *, cause: BaseException | None = None) -> None:
        """Lost now, as the watchdog declares it: releases queued, and the holder told (``on_lost``, or
        the body of ``async with`` cancelled)."""
        tenure = self.tenure
        self.mark_lost(why, (), watchdog=True)
        lost = tenure.lost
        assert lost is not None
        lost.__cause__ = cause
        if tenure.on_lost is not None:
            try:
                tenure.on_lost(lost)
                return
            except Exception:
                # Not told: the body must not run on believing it holds the lock.
                log.exception("redlock %r: on_lost callback failed: cancelling the body", tenure.name)
        tenure.cancel_host(f"redlock: {why}")

    # -- what the Redlock tells a held lock (Cluster.held keeps keepers) ------------------------

    def watchdog_failed(self, exc: BaseException) -> None:
        """The watchdog stopped on an internal error: a watched lease can no longer be kept."""
        tenure = self.tenure
        if tenure.phase is not _HELD or not tenure.watched:
            return
        self.lose_watched(
            f"lock {tenure.name!r} is given up: the watchdog stopped on an internal error "
            f"({type(exc).__name__}: {exc}; its traceback is in the log)",
            cause=exc,
        )

    def redlock_closed(self, why: str) -> None:
        """The Redlock closes while the lock is held: release it, and tell its holder it is lost."""
        tenure = self.tenure
        if tenure.phase is not _HELD or tenure.lease.token is None:
            return
        if tenure.watched:
            self.lose_watched(why)  # the body is cancelled (or on_lost told), as for any loss
        else:
            self.mark_lost(why, ())

    def node_lost(self, node: int, why: str) -> None:
        """Node *node*'s clock jumped ahead, so the key may be gone there: it no longer counts as a holder.
        When fewer than a majority of confirmed holders remain, the lock is lost at once; inside ``async
        with``, if nodes whose answer came after the grant (not counted, yes or no) could make up the
        majority, the watchdog extends it at once instead, and that round decides."""
        tenure = self.tenure
        lease = tenure.lease
        if tenure.phase is not _HELD or lease.token is None:
            return
        votes = tenure.votes
        if node in lease.holders:
            lease.holders = [i for i in lease.holders if i != node]
        elif not (node < len(votes) and votes[node] is _PENDING):
            return  # it never counted for this lease
        nodes = self.cluster.nodes
        need = _algorithm.quorum(len(nodes))
        if len(lease.holders) >= need:
            return
        now = _clock.now()
        # Nodes that answered after the grant (their yes not counted) may hold it too, unless their clock jumped.
        late = sum(1 for i, vote in enumerate(votes) if vote is _PENDING and nodes[i].clock_held_until <= now)
        if tenure.watched and len(lease.holders) + late >= need:
            self.cluster.watchdog.schedule(lease, now)
            return
        lost = (
            f"lock {tenure.name!r} is lost: node {self.cluster.names[node]} may have dropped it ({why}); "
            "no majority holds it"
        )
        if tenure.watched:
            self.lose_watched(lost)
        else:
            self.mark_lost(lost, ())

    # -- release ---------------------------------------------------------------------

    async def release(self, cooldown: float | None) -> None:
        """``release()``: delete the lease on every node (keep it *cooldown* s instead, if not None)."""
        tenure = self.tenure
        if tenure.phase is _LOST:
            tenure.forget()
            return
        lease = tenure.lease
        if tenure.phase is not _HELD or lease.token is None:
            raise RuntimeError(f"release() of lock {tenure.name!r}, which is not held")
        cluster = self.cluster
        if cooldown is not None:
            # Kept, not deleted: the keys expire `cooldown` s from now (compare-and-PEXPIRE on a majority, or
            # LockLost). Unwatched first, so the watchdog sends no later extension (its rounds out went first).
            tenure.let_go()
            await self.extend(dataclasses.replace(self.settings, ttl=cooldown))
            tenure.to(_IDLE)
            emit(cluster, tenure, _RELEASED, duration=0.0, held_for=_clock.now() - lease.acquired_at)
            return
        token, holders = lease.token, lease.holders
        began = _clock.now()
        tenure.to(_IDLE)
        strategy = self.strategy
        ballot = Ballot(cluster.nodes, vote_of_script, self.settings.node_timeout, majority=False, wait_for=holders)
        if strategy.next_is_ours(token):
            # The release and the next waiter's round go out in one write per node, in that order.
            nodes = cluster.nodes
            for node in nodes:
                node.cork()
            strategy.send_release(lease, token, lease.skip, into=ballot, handed=True)
            strategy.hand_over(token)
            for node in nodes:
                node.uncork()
        else:
            strategy.send_release(lease, token, lease.skip, into=ballot)
        failure: ReleaseFailed | None = None  # else a node refusing the script (ACL) keeps every key a ttl
        try:
            await ballot.start().decided()  # (ballot.wait(), without its coroutine: its cancel is below)
            tenure.heard(ballot)
            # (No comprehension here: one naming ballot or holders made them cells, on every release.)
            if _ERROR in ballot.votes and _ERROR in map(ballot.votes.__getitem__, holders):
                # (A failure needs more errors than nodes outside a majority, so a holder's among them.)
                failure = await release_failure(self, ballot, lease.skip, lease.ttl_ms)
                if failure is None:
                    failed = [str(o) for o in map(self.outcomes().__getitem__, holders) if o.vote is _ERROR]
                    log.warning("redlock %r not released on %s: the key stays until it expires", tenure.name, failed)
                else:
                    log.warning("redlock %s", failure)
        except asyncio.CancelledError:
            ballot.cancel()  # its timer, as ballot.wait() stops it when cancelled
            # Gone out, no longer held: said as when waited for (also if cut short while its failure was judged).
            tenure.heard(ballot)  # so far: the rest pending
            if heard(cluster, _RELEASED):
                now = _clock.now()
                emit(cluster, tenure, _RELEASED, duration=now - began, held_for=now - lease.acquired_at)
            raise
        if heard(cluster, _RELEASED):
            now = _clock.now()
            why = "" if failure is None else str(failure.args[0])
            emit(cluster, tenure, _RELEASED, duration=now - began, held_for=now - lease.acquired_at, reason=why)
        if failure is not None:
            raise failure


async def release_failure(keeper: Keeper, ballot: Ballot, skip: Sequence[int], ttl_ms: int) -> ReleaseFailed | None:
    """The ReleaseFailed of a release that answered errors on so many nodes that a majority may keep its
    key (none left free for another to take it), None otherwise. Only called once a holder answered an
    error: the other nodes' answers (a node whose yes came after the grant keeps the key too) are waited
    for up to the node timeout, then counted."""
    nodes, replies = keeper.cluster.nodes, ballot.replies
    asked = [i for i in range(len(nodes)) if i not in skip]
    until = _clock.now() + keeper.settings.node_timeout
    # (Polled: a decided ballot keeps late replies, with nothing to await; this is the failure's path only.)
    while any(replies[i] is UNANSWERED for i in asked) and _clock.now() < until:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    votes = list(ballot.votes)
    details = list(ballot.details or [""] * len(nodes))
    for i in asked:
        if votes[i] is _PENDING and replies[i] is not UNANSWERED:
            votes[i] = vote_of_script(replies[i])
            reply = replies[i]
            details[i] = reply.detail if isinstance(reply, Failure) else ""
    failed = [i for i in asked if votes[i] is _ERROR]
    count = len(nodes)
    if count - len(failed) >= _algorithm.quorum(count):
        return None
    tenure = keeper.tenure
    tenure.heard(Heard(votes, details))
    told = outcomes(nodes, votes, details)
    reasons = "; ".join(f"{told[i].node}: {told[i].detail or 'error'}" for i in failed)
    return ReleaseFailed(
        f"lock {tenure.name!r} was not released: the release failed on {len(failed)} of the {count} nodes "
        f"({reasons}), which keep its key: no one can take it until the key expires there (at most "
        f"{ttl_ms / 1000:g} s from the last grant or extension)",
        name=tenure.label,
        outcomes=told,
    )


# -- a hand-over (a read/write lock's downgrade): told by the lock, kept by its keeper -------------------------


def loss(keeper: Keeper) -> LockLost | None:
    """Why a lock that is not held (a read/write lock's writer asked to downgrade) was, when it was held: its
    LockLost (lost), or one saying its validity ran out (not yet declared lost); None when it was not
    acquired or was released."""
    tenure = keeper.tenure
    if tenure.phase is _LOST:
        return keeper._gone()
    if tenure.phase is _HELD and not keeper.held:
        why = f"lock {tenure.name!r}: its validity ran out (not extended in time)"
        return LockLost(why, name=tenure.label, outcomes=keeper.outcomes())
    return None


def hand_over(keeper: Keeper, successor: Successor) -> None:
    """Before a request that, on each node in one step, swaps *keeper*'s held lease for *successor*'s (a
    downgrade): from now on a refusal is no loss (an extension that lands after the swap is refused
    there), so the watchdog lets the lease go (its rounds out change nothing) and an ``extend()``
    waits for :func:`handed_over`'s verdict."""
    tenure = keeper.tenure
    tenure.let_go()
    keeper.cluster.watchdog.discard(tenure.lease)
    keeper.handover = (tenure.lease, asyncio.get_running_loop().create_future(), successor)


def handed_over(keeper: Keeper, done: bool | None, why: str = "") -> LockLost | None:
    """The swap was decided (synchronous): *done*, the successor holds and this lease ends released (what
    is left of its keys released, unwaited); False, lost (*why*: the whole sentence), the LockLost
    returned; None (cancelled or failed before a verdict), released. An ``extend()`` waiting is told."""
    tenure = keeper.tenure
    handover = keeper.handover
    assert handover is not None
    lease = handover[0]
    if tenure.phase is _HELD and lease is tenure.lease and lease.token is not None:
        if done is False:
            host = tenure.host
            if host is not None and host is not asyncio.current_task() and not host.done():
                keeper.lose_watched(why)  # its body runs in another task: told as the watchdog tells a loss
            else:
                keeper.mark_lost(why, ())  # raised to the downgrade's caller
        else:
            keeper.strategy.send_release(lease, lease.token, lease.skip)
            tenure.to(_IDLE)
            emit(keeper.cluster, tenure, _RELEASED, duration=0.0, held_for=_clock.now() - lease.acquired_at)
    if not handover[1].done():
        handover[1].set_result(done)
    return tenure.lost if tenure.phase is _LOST else None
