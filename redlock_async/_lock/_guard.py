"""``async with lock``: the watchdog's hookup, and the cancellation that becomes ``LockLost``.

Inside ``async with``, the watchdog keeps the lease. If the lease is lost, the body is cancelled
the way ``asyncio.timeout()`` cancels on expiry: the host task is cancelled, and on the way out
that one cancellation (and only that one: the caller's own cancellations pass untouched) becomes
``LockLost``. Timeline of a loss::

    body awaits ... watchdog: lost -> keys released, host.cancel()
    body gets CancelledError -> leave(): uncancel(), raise LockLost
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol, TypeVar

from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._core import complete
from redlock_async._core import holder as _holder
from redlock_async._lock._emitter import emit, emit_lost
from redlock_async._lock._keeper import Keeper
from redlock_async._rounds import Ballot, Phase, not_acquired, vote_of_script
from redlock_async.errors import LockLost
from redlock_async.events import EventKind

log = logging.getLogger("redlock_async.lock")

_IDLE, _HELD, _LOST = Phase.IDLE, Phase.HELD, Phase.LOST  # module globals: see lock.py's note


class Guarded(Protocol):
    """The lock front as its guard uses it: the public acquire and release, and the cooldown."""

    cooldown: float | None

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...


G = TypeVar("G", bound=Guarded)


async def aenter(lock: G, keeper: Keeper) -> G:
    """``__aenter__``: acquire (or LockNotAcquired), bind the lock to this task, and start watching; *lock*."""
    tenure, cluster, settings = keeper.tenure, keeper.cluster, keeper.settings
    if not await lock.acquire():
        raise not_acquired(
            tenure.label, repr(tenure.name), settings.acquire_timeout, cluster.nodes, tenure.votes, tenure.details
        )
    host = asyncio.current_task()
    assert host is not None
    # Held by this task (the blocking API: by its thread) until the lease ends: its nested acquires of
    # the same keys fail at once.
    holder = _holder.of(host)
    cluster.bind(tenure.keys, holder)
    if settings.auto_extend:
        tenure.watch(holder, host)
        lease = tenure.lease
        lease.due, lease.result = keeper.due, keeper.result
        cluster.watchdog.schedule(lease, keeper.next_due())
    else:
        tenure.watch(holder, None)  # bound, not watched
    return lock


async def aexit(lock: Guarded, keeper: Keeper, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
    """``__aexit__``: release, or raise LockLost when the lease was lost while the body ran."""
    tenure, cluster = keeper.tenure, keeper.cluster
    # Before any await: from here on the watchdog cannot cancel us.
    host, cancelled_by_us = tenure.host, tenure.cancelled_host
    tenure.unwatch()
    cluster.watchdog.discard(tenure.lease)
    try:
        if cancelled_by_us and host is not None:
            # Our cancel was requested while the body was suspended (callbacks run
            # only then), so it was delivered inside the body: nothing is pending
            # that 3.11 could not withdraw. Take back our count; if the body let
            # the CancelledError out and no one else cancelled, it becomes LockLost.
            others = host.uncancel() > tenure.host_cancelling
            if exc_type is asyncio.CancelledError and not others:
                await cluster.watchdog.forget(tenure.lease)
                lost = tenure.lost
                assert lost is not None
                raise lost from (lost.__cause__ or exc)
        # Our clock says the validity ran out while the body ran (a blocked loop,
        # or many holders exiting at once): the nodes decide whether it was lost.
        overran = host is not None and tenure.phase is _HELD and _clock.now() >= tenure.lease.expires
        if overran or exc_type is asyncio.CancelledError:
            # Deciding a loss, or leaving a cancelled scope (anyio cancels again at every await):
            # the confirmation, the state and the lost event must not be cut short.
            await complete(_cleanup(lock, keeper, exc, overran, watched=host is not None))
        else:
            try:  # _cleanup, inlined (one coroutine less per exit)
                if tenure.phase is _HELD:  # _exit's common case (not overran here), inlined: one coroutine less
                    try:
                        await keeper.release(lock.cooldown)  # lock.release(), one coroutine less
                    except Exception as failed:
                        if exc is None:
                            raise
                        _noted(tenure.name, exc, failed)
                else:
                    await _exit(lock, keeper, exc, overran, watched=host is not None)
            finally:
                # watchdog.forget, inlined: its coroutine only when the watchdog's task must be waited for.
                if host is not None and (task := cluster.watchdog.let_go(tenure.lease)) is not None:
                    await asyncio.wait([task])
    finally:
        tenure.unbind()  # the lease ended in there (that unbinds it); this is for a failed exit


async def _cleanup(lock: Guarded, keeper: Keeper, exc: BaseException | None, overran: bool, *, watched: bool) -> None:
    try:
        await _exit(lock, keeper, exc, overran, watched=watched)
    finally:
        if watched:
            # After the release went out: stopping the watchdog's task must not delay the hand-off.
            await keeper.cluster.watchdog.forget(keeper.tenure.lease)


async def _exit(lock: Guarded, keeper: Keeper, exc: BaseException | None, overran: bool, *, watched: bool) -> None:
    """Release on the way out of ``async with``; raise LockLost if the lock was lost while watched."""
    tenure = keeper.tenure
    if tenure.phase is _HELD and overran and lock.cooldown is None:  # with a cooldown: release() tells
        confirmed, holders = await _release_confirmed(keeper)
        if confirmed:
            return  # a majority still held our key at release: no one else can have held it
        why = f"lock {tenure.name!r} ran out while the body ran" + _overrun_cause(tenure.votes, holders)
        tenure.to(_LOST, LockLost(why, name=tenure.label, outcomes=keeper.outcomes()))
        emit_lost(keeper.cluster, tenure, why, watchdog=True)
    if tenure.phase is _LOST:
        tenure.forget()
        if exc is None and watched and tenure.on_lost is None:
            assert tenure.lost is not None
            raise tenure.lost  # the body finished, but not under the lock the whole time
        return
    if tenure.phase is not _HELD:
        return  # released by the body itself
    try:
        await keeper.release(lock.cooldown)  # lock.release(), one coroutine less
    except Exception as failed:
        if exc is None:
            raise
        _noted(tenure.name, exc, failed)


def _noted(name: object, exc: BaseException, failed: Exception) -> None:
    """Never let a release problem mask what the body raised: it goes with it, as a note."""
    log.exception("redlock %r: release failed after the body raised", name)
    exc.add_note(f"redlock: and then leaving `async with` failed: {type(failed).__name__}: {failed}")


def _overrun_cause(votes: Sequence[_algorithm.Vote], holders: Sequence[int]) -> str:
    """Why an overrun lease was not confirmed at release: the nodes were silent, or the key was gone."""
    silent = [i for i in holders if votes[i] not in (_algorithm.YES, _algorithm.NO)]
    if len(silent) > len(holders) - _algorithm.quorum(len(votes)):
        if any(votes[i] is _algorithm.ERROR for i in silent):  # a refusal (an ACL, a replica) is no silence
            return (
                f": {len(silent)} of the {len(holders)} nodes that held it could not run the release (an error "
                "or no answer: the reasons are in the votes; the watchdog could not extend it either)"
            )
        return (
            f": {len(silent)} of the {len(holders)} nodes that held it did not answer the release "
            "(nodes unreachable: the watchdog could not extend it either)"
        )
    return ": the key was gone from the nodes that held it (the event loop blocked past the validity?)"


async def _release_confirmed(keeper: Keeper) -> tuple[bool, list[int]]:
    """Release, and tell whether our key was still on a majority of the nodes that held it throughout.

    Only nodes that said yes at the grant (or the last extension) count: a SET of the same
    acquisition still in flight at the grant (held by a partition that healed later) can
    re-create our key on another node after someone else held the lock meanwhile, so our
    key there at release proves nothing.
    """
    tenure, cluster, settings = keeper.tenure, keeper.cluster, keeper.settings
    lease = tenure.lease
    token, holders = lease.token, lease.holders
    assert token is not None
    lease.token, lease.holders = None, []
    # The question is only whether those nodes still held our key when the release
    # ran; a busy loop may read the answers late, so wait for them up to a connect timeout.
    nodes = cluster.nodes
    wait = max(settings.node_timeout, settings.connect_timeout)
    ballot = Ballot(nodes, vote_of_script, wait, majority=False, wait_for=holders, rearm=settings.node_timeout)
    keeper.strategy.send_release(lease, token, lease.skip, into=ballot)
    await ballot.start().wait()
    tenure.heard(ballot)
    kept = sum(1 for i in holders if ballot.votes[i] is _algorithm.YES)
    confirmed = kept >= _algorithm.quorum(len(nodes))
    if confirmed:
        tenure.to(_IDLE)
        now = _clock.now()
        emit(cluster, tenure, EventKind.RELEASED, duration=now - ballot.decided_at, held_for=now - lease.acquired_at)
    return confirmed, holders
