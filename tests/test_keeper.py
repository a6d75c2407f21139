"""_keeper without servers: extension, loss and release of a held lease, on fake nodes.

An explicit ``extend()`` and the watchdog's round must follow the same verdict the same way (one
judge, ``_lease.after_extension``): each case below runs both and compares.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from redlock_async._core import _clock
from redlock_async._core._algorithm import Vote
from redlock_async._rounds._judge import GONE
from redlock_async._rounds._lease import Phase
from redlock_async.errors import LockLost

from .fakes import virtual
from .parts import Parts, held, parts, say

YES, NO, TIMEOUT = Vote.YES, Vote.NO, Vote.TIMEOUT


async def holding(**settings: object) -> Parts:
    p = parts(**settings)  # type: ignore[arg-type]
    p.tenure.to(Phase.ACQUIRING)
    assert await p.strategy.acquire(p.tenure, False, _clock.now())
    return p


def test_a_confirmed_extension_moves_the_validity_alike_for_extend_and_the_watchdog() -> None:
    async def test() -> None:
        explicit, watched = await holding(), await holding()
        await asyncio.sleep(1.0)
        say(explicit.answers, [4], extend="no")
        started = _clock.now()
        await explicit.keeper.extend(explicit.cluster.settings)
        decided = _clock.now()
        watched.tenure.watched = True
        lease = watched.tenure.lease
        votes = list(explicit.tenure.votes)  # decided at the third yes
        assert votes[:3] == [YES] * 3
        watched.keeper.result(lease, started, decided, votes, None)
        for p in (explicit, watched):
            assert p.tenure.phase is Phase.HELD
            assert p.tenure.lease.holders == [0, 1, 2]
            assert p.tenure.lease.expires == pytest.approx(decided + 10.0 - 0.1 - 0.002, abs=1e-6)
        assert watched.tenure.lease.extensions == 1  # the watchdog counts its extensions (max_extensions)
        for p in (explicit, watched):
            await p.cluster.watchdog.aclose()

    virtual(test)


def test_a_refused_extension_loses_the_lock_alike_for_extend_and_the_watchdog() -> None:
    async def test() -> None:
        explicit, watched = await holding(), await holding()
        say(explicit.answers, range(3), extend="no")
        with pytest.raises(LockLost, match="^" + re.escape(f"lock 'r' {GONE}; votes")) as raised:
            await explicit.keeper.extend(explicit.cluster.settings)
        watched.tenure.watched = True
        now = _clock.now()
        watched.keeper.result(watched.tenure.lease, now, now, [NO, NO, NO, YES, YES], None)
        assert watched.tenure.lost is not None
        assert watched.tenure.lost.args[0] == raised.value.args[0]
        for p in (explicit, watched):
            assert p.tenure.phase is Phase.LOST
            assert p.front not in held(p.cluster)
            assert p.tenure.lease.holders == []
            await asyncio.sleep(0.01)
            # What may be left of it is released on every node.
            assert all(answer.seen[-1] == "release" for answer in p.answers)
            await p.cluster.watchdog.aclose()

    virtual(test)


def test_an_unanswered_extension_is_retried_while_validity_is_left() -> None:
    async def test() -> None:
        explicit, watched = await holding(), await holding()
        say(explicit.answers, range(3), extend="silent")
        task = asyncio.create_task(explicit.keeper.extend(explicit.cluster.settings))
        await asyncio.sleep(1.5)  # a retry after ttl / 10
        assert not task.done()
        assert sum(answer.seen.count("extend") for answer in explicit.answers[:1]) > 1  # tried again
        say(explicit.answers, range(3), extend="yes")
        await task
        assert explicit.tenure.phase is Phase.HELD
        watched.tenure.watched = True
        now = _clock.now()
        watched.keeper.result(watched.tenure.lease, now, now + 0.05, [TIMEOUT, TIMEOUT, TIMEOUT, YES, YES], None)
        assert watched.tenure.phase is Phase.HELD
        assert watched.cluster.watchdog.retries == 1
        for p in (explicit, watched):
            await p.cluster.watchdog.aclose()

    virtual(test)


def test_a_loss_declared_while_watched_tells_on_lost_instead_of_cancelling() -> None:
    async def test() -> None:
        p = await holding()
        told: list[LockLost] = []
        p.tenure.on_lost, p.tenure.watched = told.append, True
        p.tenure.host = asyncio.current_task()
        p.keeper.lose_watched("lock 'r' lost for a test")
        assert [lost.args[0] for lost in told] == ["lock 'r' lost for a test"]
        assert not p.tenure.cancelled_host  # on_lost was told: the body runs on
        assert p.tenure.phase is Phase.LOST
        await p.cluster.watchdog.aclose()

    virtual(test)


def test_release_of_a_lost_lock_does_nothing_and_of_an_idle_one_says_so() -> None:
    async def test() -> None:
        p = await holding()
        p.keeper.mark_lost("lock 'r' lost", ())
        await p.keeper.release(None)
        assert p.tenure.lease.token is None  # nothing more of it is released at the next acquire
        p.tenure.to(Phase.ACQUIRING)
        p.tenure.to(Phase.IDLE)
        with pytest.raises(RuntimeError, match="release\\(\\) of lock 'r', which is not held"):
            await p.keeper.release(None)
        await p.cluster.watchdog.aclose()

    virtual(test)
