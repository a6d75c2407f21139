"""The waiter line (``_line.ParkingLot``), server-free on virtual time: FIFO by ticket, one wake per release,
the turn passed on by a woken waiter that never tries, and what a newcomer reads (``taking``)."""

from __future__ import annotations

import asyncio

from redlock_async._core._lot import ParkingLot, Waits, ticket

from .fakes import virtual

LONG = 3600.0  # a fallback timer that never fires in these tests (virtual time: no real wait)


async def settle() -> None:
    """Let every ready task run until each awaits something that is not ready."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_tickets_increase() -> None:
    first, second = ticket(), ticket()
    assert second > first


def test_releases_wake_waiters_in_ticket_order_not_arrival_order() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        places = [ticket() for _ in range(3)]
        woken: list[int] = []

        async def waiter(place: int) -> None:
            assert await line.wait(place, LONG, waits)
            woken.append(place)

        # They reach the line youngest first: the oldest ticket still goes first.
        tasks = [asyncio.create_task(waiter(place)) for place in reversed(places)]
        await settle()
        assert line.waiting
        assert not line.taking
        for expected in places:
            assert line.release()
            await settle()
            assert woken[-1] == expected
            assert line.taking
            line.done()
        assert woken == places
        assert waits.wakeups == 0  # ParkingLot.wait counts only a turn passed on; callers count what they wake
        await asyncio.gather(*tasks)
        assert not line.waiting

    virtual(test)


def test_one_wake_per_release_and_a_release_heard_while_one_tries_is_kept() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        places = [ticket() for _ in range(3)]
        woken: list[int] = []

        async def waiter(place: int) -> None:
            await line.wait(place, LONG, waits)
            woken.append(place)

        tasks = [asyncio.create_task(waiter(place)) for place in places]
        await settle()
        assert line.release() is True  # wakes the oldest, only
        await settle()
        assert woken == places[:1]
        # Two more releases while it tries (a semaphore's permits): each is kept, none wakes now.
        assert line.release() is False
        assert line.release() is False
        await settle()
        assert woken == places[:1]
        assert line.done() is True  # the first kept release wakes the next one
        await settle()
        assert woken == places[:2]
        assert line.done() is True  # the second kept release wakes the last one
        await settle()
        assert woken == places
        assert line.done() is False  # nothing kept: no one to wake, and no release kept for later
        assert not line.released
        await asyncio.gather(*tasks)

    virtual(test)


def test_a_waiter_cancelled_in_the_loop_turn_it_was_woken_passes_its_turn_on() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        first, second = ticket(), ticket()
        oldest = asyncio.create_task(line.wait(first, LONG, waits))
        following = asyncio.create_task(line.wait(second, LONG, waits))
        await settle()
        assert line.release()
        oldest.cancel()  # same loop turn: its wake-up is scheduled, it has not run
        await settle()
        assert oldest.cancelled()
        assert following.done()
        assert following.result() is True
        assert waits.wakeups == 1  # the wake it passed on is counted for its owner
        assert line.taking  # the following waiter tries now
        assert line.depart(first) is False
        line.done()
        assert line.depart(second) is False
        assert not line.waiting
        assert not line.taking

    virtual(test)


def test_a_waiter_cancelled_while_it_waits_unwoken_wakes_no_one() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        first, second = ticket(), ticket()
        oldest = asyncio.create_task(line.wait(first, LONG, waits))
        following = asyncio.create_task(line.wait(second, LONG, waits))
        await settle()
        oldest.cancel()
        await settle()
        assert not following.done()
        assert waits.wakeups == 0
        assert not line.taking
        assert line.first() == second  # the cancelled waiter left the line
        assert line.release()
        assert await following

    virtual(test)


def test_a_waiter_woken_between_two_waits_gets_its_turn_or_passes_it_on() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        first, second = ticket(), ticket()
        assert await line.wait(first, 0.01, waits) is False  # its fallback timer fired: between two waits
        assert line.waiting
        assert not line.parked(first)
        assert line.first() == first
        following = asyncio.create_task(line.wait(second, LONG, waits))
        await settle()
        assert line.release()  # the oldest is woken though it does not wait now: its turn is kept
        await settle()
        assert not following.done()
        assert line.taking
        assert await line.wait(first, LONG, waits) is True  # at once
        line.done()
        # Once more, but it departs instead of coming back: the turn passes on.
        third = ticket()
        assert await line.wait(third, 0.01, waits) is False
        assert line.depart(first) is False  # not woken: nothing to pass on
        assert line.release()  # the oldest now is `second`, which awaits
        await settle()
        assert following.done()
        line.done()
        assert line.depart(second) is False
        fourth = ticket()
        last = asyncio.create_task(line.wait(fourth, LONG, waits))
        await settle()
        assert line.release()  # wakes `third`, between two waits
        assert line.depart(third) is True  # never tried: the turn passes on, to `fourth`
        assert await last is True
        line.done()
        line.depart(fourth)
        fifth = ticket()
        assert await line.wait(fifth, 0.01, waits) is False  # its timer fired: between two waits
        assert line.release()
        assert line.depart(fifth) is False  # its turn passes on to no one: kept again
        assert line.released
        assert not line.taking
        assert await line.wait(ticket(), LONG, waits) is True  # the kept release: at once

    virtual(test)


def test_a_timer_keeps_the_waiters_place_ahead_of_younger_ones() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        first, second = ticket(), ticket()
        assert await line.wait(first, 0.01, waits) is False
        younger = asyncio.create_task(line.wait(second, LONG, waits))
        await settle()
        back = asyncio.create_task(line.wait(first, LONG, waits))  # back in line, at its old place
        await settle()
        assert line.release()
        await settle()
        assert back.done()
        assert not younger.done()
        line.done()
        line.depart(first)
        line.release()
        assert await younger

    virtual(test)


def test_woken_in_the_loop_turn_its_timer_fires_counts_as_woken() -> None:
    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        place = ticket()
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(line.wait(place, 1.0, waits))
        await settle()
        loop.call_at(loop.time() + 1.0, line.release)  # scheduled with the timer, after it
        assert await waiting is True
        assert line.taking

    virtual(test)


def test_the_newcomer_rule_taking_is_true_only_while_a_release_is_being_taken() -> None:
    """``taking`` tells a newcomer whether to join the line without trying (a release was heard and
    a woken waiter is trying): waiters that only wait for their timers must not hold it back."""

    async def test() -> None:
        line, waits = ParkingLot(), Waits()
        assert not line.waiting
        assert not line.taking
        place = ticket()
        parked = asyncio.create_task(line.wait(place, LONG, waits))
        await settle()
        assert line.waiting
        assert not line.taking
        line.release()
        assert line.taking  # woken, trying: a newcomer joins the line, the release is not its
        await parked
        line.done()
        line.depart(place)
        assert not line.waiting
        assert not line.taking
        # A release heard by no one is kept, but is not "taking": the first waiter takes it at once.
        line.release()
        assert line.released
        assert not line.taking
        assert await line.wait(ticket(), LONG, waits) is True
        assert line.taking

    virtual(test)


def test_interrupt_ends_every_wait_as_not_woken_and_keeps_no_place() -> None:
    async def test() -> None:
        line, waits, others = ParkingLot(), Waits(), Waits()
        mine, theirs = ticket(), ticket()
        interrupted = asyncio.create_task(line.wait(mine, LONG, waits))
        other = asyncio.create_task(line.wait(theirs, LONG, others))
        await settle()
        waits.interrupt()
        assert await interrupted is False
        assert line.first() == theirs
        assert not other.done()
        assert await line.wait(ticket(), LONG, waits) is False  # later waits end at once
        line.release()
        assert await other

    virtual(test)
