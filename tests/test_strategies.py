"""_strategies without servers: how each kind of lock is taken, on fake nodes."""

from __future__ import annotations

import asyncio

from redlock_async._core import _clock
from redlock_async._core._algorithm import Vote
from redlock_async._lock._semaphore import Permit
from redlock_async._lock._strategies import Many, Queued, Words
from redlock_async._nodes._wire import Reply
from redlock_async._rounds._lease import Phase
from redlock_async._scripts import ACQUIRE_ALL
from redlock_async.lock import Lock
from redlock_async.semaphore import Semaphore
from redlock_async.testing._inside import strategy_of

from .fakes import Request, virtual
from .parts import fake_cluster, held, parts, say


def test_a_majority_of_yes_grants_a_lease_held_by_those_nodes() -> None:
    async def test() -> None:
        p = parts()
        say(p.answers, [3, 4], acquire="no")
        p.tenure.to(Phase.ACQUIRING)
        assert await p.strategy.acquire(p.tenure, False, _clock.now())
        assert p.tenure.phase is Phase.HELD
        assert p.tenure.lease.holders == [0, 1, 2]
        assert p.front in held(p.cluster)  # the phase change did what HELD implies
        assert p.tenure.attempts == 1
        await p.cluster.watchdog.aclose()

    virtual(test)


def test_a_failed_attempt_leaves_no_key_behind_and_the_lock_idle() -> None:
    async def test() -> None:
        p = parts()
        say(p.answers, [0, 1, 2], acquire="no")
        p.tenure.to(Phase.ACQUIRING)
        assert not await p.strategy.acquire(p.tenure, False, _clock.now())
        await asyncio.sleep(0.01)
        assert p.tenure.phase is Phase.IDLE
        assert list(p.tenure.votes[:3]) == [Vote.NO] * 3  # decided then: no majority can say yes
        # Released on all nodes, the ones that said no too (a reply can be lost after the SET ran).
        assert all(answer.seen == ["acquire", "release"] for answer in p.answers)
        assert p.front not in held(p.cluster)
        await p.cluster.watchdog.aclose()

    virtual(test)


def test_a_blocking_acquire_retries_until_its_time_runs_out() -> None:
    async def test() -> None:
        p = parts(retry_delay=0.2, wait_for_release=False)
        say(p.answers, range(3), acquire="no")
        p.tenure.to(Phase.ACQUIRING)
        began = _clock.now()
        assert not await p.strategy.acquire(p.tenure, True, began + 1.0)
        assert p.tenure.attempts > 2
        assert _clock.now() - began >= 1.0
        assert p.tenure.phase is Phase.IDLE
        await p.cluster.watchdog.aclose()

    virtual(test)


def test_each_primitive_is_a_lock_front_given_its_strategy() -> None:
    async def test() -> None:
        cluster, _, _ = fake_cluster()
        kinds = {
            "lock": (Lock(cluster, "a", cluster.settings), Words),
            "lock_many": (Lock(cluster, ("a", "b"), cluster.settings), Many),
            "queue": (Lock(cluster, "a", cluster.lease_settings(cluster.settings, queue=True)), Queued),
            "semaphore": (Semaphore(cluster, "a", 3, cluster.settings), Permit),
        }
        for what, (lock, kind) in kinds.items():
            assert isinstance(lock, Lock), what
            assert type(strategy_of(lock)) is kind, what
        # Nothing private is overridden: a Semaphore adds its limit and its repr, and that is all.
        assert {name for name in vars(Semaphore) if name.startswith("_")} <= {
            "__init__",
            "__repr__",
            "__slots__",
            "__module__",
            "__doc__",
            "_limit",
            "__annotations__",
            "__firstlineno__",
            "__static_attributes__",
        }
        await cluster.watchdog.aclose()

    virtual(test)


def test_several_names_listen_on_the_name_most_refusing_nodes_found_held() -> None:
    async def test() -> None:
        cluster, nodes, _ = fake_cluster()
        many = Many(cluster, cluster.settings, ("a", "b", "c"), None, ("a", "b", "c"))
        # ACQUIRE_ALL answers -i for the i-th key found held: two nodes found "c" held, one "b".
        for node, code in zip(nodes[:3], (-3, -2, -3), strict=True):

            def respond(request: Request, code: int = code) -> Reply:
                return code if request.args[1] == ACQUIRE_ALL.sha else 1

            node.respond = respond
        tenure = parts().tenure
        tenure.to(Phase.ACQUIRING)
        assert not await many.attempt(tenure)
        assert many.blocked == many.keys[2]
        assert not many.next_is_ours(b"token")  # only single locks are handed over
        await cluster.watchdog.aclose()

    virtual(test)


def test_a_permit_counts_its_limit_for_nested_acquires_and_is_not_handed_over() -> None:
    async def test() -> None:
        cluster, _, _ = fake_cluster()
        permit = Permit(cluster, cluster.settings, "pool", 4, None)
        assert permit.permits == 4
        assert permit.held_words("pool") == "every permit (4 of limit 4) of semaphore 'pool'"
        assert not permit.next_is_ours(b"token")
        assert not permit.takes_hand_over
        assert permit.keys == (permit.blocked,)  # its waiters listen on the name, whichever slot is freed
        await cluster.watchdog.aclose()

    virtual(test)
