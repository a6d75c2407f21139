"""The hand-off's Listener without servers: fake subscriber nodes, release words fed by the test.

A waiter is woken once a majority of nodes announced a release, the oldest first, once per
release; a waiter cancelled in the loop turn it is woken passes its turn on.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from redlock_async._core._lot import ticket
from redlock_async._nodes._wire import Reply
from redlock_async._shared._handoff import LINGER, Listener

from .fakes import FakeNode, Request, as_nodes, fake_nodes, virtual

CHANNEL = b"redlock:job"
_scopes = itertools.count()


def subscription_confirmed(request: Request) -> Reply:
    """What a node answers to (UN)SUBSCRIBE: the confirmation, with one channel subscribed."""
    return [request.args[0].lower(), request.args[1], 1]


def listener(n: int = 5) -> tuple[Listener, list[FakeNode]]:
    nodes = fake_nodes(n, respond=subscription_confirmed)
    made = Listener(0.05, scope=(f"scope-{next(_scopes)}",))  # a scope of its own: no queue shared with others
    made.nodes = as_nodes(nodes)
    return made, nodes


def words(made: Listener, token: bytes, count: int) -> None:
    for _ in range(count):
        made.on_message([b"message", CHANNEL, token])


async def waiter(made: Listener, woken: list[int], name: int, place: int) -> None:
    await made.subscribe(CHANNEL)
    try:
        if await made.wait(CHANNEL, 5.0, place):
            woken.append(name)
            made.done(CHANNEL)
    finally:
        made.depart(CHANNEL, place)
        made.unsubscribe(CHANNEL)


def test_a_waiter_is_woken_by_a_majority_of_words_not_the_first() -> None:
    # Virtual time (tests/fakes.py): the LINGER waits take no real time.
    async def test() -> None:
        made, nodes = listener()
        woken: list[int] = []
        task = asyncio.create_task(waiter(made, woken, 0, ticket()))
        await asyncio.sleep(0.01)
        assert all(node.sent == [(b"SUBSCRIBE", CHANNEL)] for node in nodes)
        words(made, b"release-1", 2)
        await asyncio.sleep(0.01)
        assert woken == []  # 2 of 5: the release may not have reached a majority yet
        words(made, b"release-1", 1)
        await asyncio.wait_for(task, 1.0)
        assert woken == [0]
        assert made.wakeups == 1
        # The subscription is kept a while after its last user (LINGER), then dropped.
        assert all(node.sent == [(b"SUBSCRIBE", CHANNEL)] for node in nodes)
        await asyncio.sleep(LINGER + 0.05)
        assert all(node.sent[-1] == (b"UNSUBSCRIBE", CHANNEL) for node in nodes)

    virtual(test)


def test_a_kept_subscription_serves_the_next_waiter_without_a_new_one() -> None:
    # Virtual time (tests/fakes.py): the LINGER waits take no real time.
    async def test() -> None:
        made, nodes = listener()
        assert await made.subscribe(CHANNEL)  # subscribed anew: look again once
        made.unsubscribe(CHANNEL)
        assert await made.subscribe(CHANNEL)  # kept: nothing sent, but words went unheeded meanwhile, so look again
        assert all(node.sent == [(b"SUBSCRIBE", CHANNEL)] for node in nodes)
        made.unsubscribe(CHANNEL)
        made.close()  # the Redlock closes: the kept subscription is forgotten, nothing more is sent
        await asyncio.sleep(LINGER + 0.05)
        assert all(node.sent == [(b"SUBSCRIBE", CHANNEL)] for node in nodes)

    virtual(test)


async def test_the_oldest_waiter_first_and_one_waiter_per_release() -> None:
    made, _ = listener()
    woken: list[int] = []
    places = [ticket() for _ in range(3)]
    tasks = [asyncio.create_task(waiter(made, woken, i, places[i])) for i in (2, 0, 1)]  # start out of order
    await asyncio.sleep(0.01)
    words(made, b"release-1", 5)  # every node's word: still one release, one waiter
    await asyncio.sleep(0.01)
    assert woken == [0]
    words(made, b"release-2", 3)
    await asyncio.sleep(0.01)
    assert woken == [0, 1]
    words(made, b"release-1", 1)  # a late word of the first release wakes no one
    await asyncio.sleep(0.01)
    assert woken == [0, 1]
    words(made, b"release-3", 3)
    await asyncio.gather(*tasks)
    assert woken == [0, 1, 2]
    assert made.wakeups == 3


async def test_a_waiter_cancelled_in_its_wake_turn_passes_the_turn_on() -> None:
    made, _ = listener()
    woken: list[int] = []
    first = asyncio.create_task(waiter(made, woken, 0, ticket()))
    second = asyncio.create_task(waiter(made, woken, 1, ticket()))
    await asyncio.sleep(0.01)
    words(made, b"release-1", 3)  # wakes the first: its future is set, it has not run yet
    first.cancel()  # cancelled in the same loop turn (its own timeout, a task group)
    await asyncio.wait_for(second, 1.0)  # the turn passed on: no need for another release
    assert woken == [1]
    assert first.cancelled()


async def test_a_release_heard_before_anyone_waits_lets_the_next_waiter_go_at_once() -> None:
    made, _ = listener()
    await made.subscribe(CHANNEL)  # listening, between a failed attempt and its wait
    words(made, b"release-1", 3)
    place = ticket()
    assert await asyncio.wait_for(made.wait(CHANNEL, 5.0, place), 1.0)  # the release was not lost
    made.done(CHANNEL)
    made.depart(CHANNEL, place)
    made.unsubscribe(CHANNEL)
    assert made.wakeups == 0  # no waiter was queued to wake: the release was kept for the next one


async def test_a_wake_up_in_the_loop_turn_the_timer_fires_counts() -> None:
    """The release word and the waiter's fallback timer land in one loop turn: it was woken, not timed out.

    Taken for a timeout, the waiter would wait again while the queue believed it woken:
    no later release would wake anyone (CI saw the FIFO test hang on this, once in a dozen runs).
    """
    made, _ = listener()
    await made.subscribe(CHANNEL)
    place = ticket()
    wait = asyncio.create_task(made.wait(CHANNEL, 0.01, place))
    await asyncio.sleep(0)  # the waiter waits, its 10 ms timer armed
    time.sleep(0.03)  # the loop is busy past the timer: it fires in the next turn...
    # ...right after the words arrive (a subscriber's data_received runs before due timers):
    asyncio.get_running_loop().call_soon(words, made, b"release-1", 3)
    assert await asyncio.wait_for(wait, 1.0) is True
    assert made.wakeups == 1
    made.done(CHANNEL)
    made.depart(CHANNEL, place)
    made.unsubscribe(CHANNEL)


def test_watching_a_kept_subscription_keeps_it() -> None:
    # Virtual time (tests/fakes.py): the LINGER waits take no real time.
    async def test() -> None:
        made, nodes = listener()
        await made.subscribe(CHANNEL)
        made.unsubscribe(CHANNEL)  # kept for LINGER...
        seen: list[int] = []
        made.watch(CHANNEL, lambda: seen.append(1))  # ...and now watched: it must not be dropped
        await asyncio.sleep(LINGER + 0.05)
        assert all(node.sent == [(b"SUBSCRIBE", CHANNEL)] for node in nodes)
        # Each node's SUBSCRIBE confirmed after the watch began: a look each (words before it were lost).
        confirmed = len(seen)
        assert confirmed <= len(nodes)
        made.on_message([b"message", CHANNEL, b"word"])
        assert len(seen) == confirmed + 1
        made.close()

    virtual(test)
