"""The parking lot of a process's waiters for one key: FIFO by ticket, one woken at a time (as trio's ``ParkingLot``).

A :class:`ParkingLot` knows nothing of channels, nodes or Redis: whoever hears a
release calls :meth:`ParkingLot.release`, and the oldest waiter is woken, unless a
woken waiter is still trying (then the release is kept for the next one, as
:attr:`ParkingLot.missed`). A waiter keeps its place (its ticket) across waits: one
whose fallback timer fired comes back to its place, not to the tail. A woken
waiter that never tries (it departs, or is cancelled in the loop turn it was
woken) passes the turn on, or the line would stay "woken" for good.

The methods that may wake a waiter return True when they did, so that whoever
called them can count the wake-ups it caused; :class:`Waits` groups one owner's
waits, for :meth:`Waits.interrupt` and for the wake-ups counted inside a wait.
"""

from __future__ import annotations

import asyncio
import itertools

_tickets = itertools.count()


def ticket() -> int:
    """A waiter's place in line, taken once per acquire: older tickets are woken first."""
    return next(_tickets)


class Waits:
    """The waits of one owner (a Redlock's waiters, in every line): :meth:`interrupt` ends them all."""

    def __init__(self) -> None:
        self.parked: set[asyncio.Future[None]] = set()  # the futures its waiters await now
        self.interrupted = False
        self.wakeups = 0
        """Waiters woken by its calls, and by its waiters passing their turn on when cancelled."""

    def interrupt(self) -> None:
        """End every wait now, as not woken, and every later one at once (its owner stopped on a fault)."""
        self.interrupted = True
        for fut in self.parked:
            if not fut.done():
                fut.set_result(None)


class ParkingLot:
    """The waiters of one key in this process, oldest ticket first; at most one woken and trying."""

    __slots__ = ("missed", "released", "turn", "waiters", "woken")

    def __init__(self) -> None:
        # ticket -> the future its waiter awaits, or None between two waits (its fallback timer fired:
        # it tries, then waits again). A waiter keeps its place until it departs.
        self.waiters: dict[int, asyncio.Future[None] | None] = {}
        self.woken = False  # a waiter was woken and is trying; the others wait their turn
        self.turn: int | None = None  # the ticket woken between two of its waits: its next wait returns at once
        self.released = False  # a release came while no one was queued: the next waiter goes at once
        # Releases heard while a woken waiter was still trying: each wakes the next waiter when that
        # one is done. A semaphore's permits can be released several at once.
        self.missed = 0

    @property
    def waiting(self) -> bool:
        """True when waiters queue (one of them may be trying now)."""
        return bool(self.waiters) or self.woken

    @property
    def taking(self) -> bool:
        """True when a woken waiter is trying, or is about to (woken between two of its waits)."""
        return self.woken or self.turn is not None

    def first(self) -> int | None:
        """The oldest waiter's ticket, if any waits."""
        return min(self.waiters) if self.waiters else None

    def parked(self, place: int) -> bool:
        """True when the waiter with ticket *place* awaits its turn now (not between two waits)."""
        return self.waiters.get(place) is not None

    async def wait(self, place: int, timeout: float, waits: Waits) -> bool:
        """Wait for the turn of the waiter with ticket *place*, at most *timeout* seconds; True when woken.

        Returns at once when a release came while no one waited, or the waiter was woken between two
        of its waits. Cancelled right after it was woken, it passes the turn on (counted in *waits*).
        """
        if self.released and not self.woken:
            # A release came between our last attempt and now (nobody was queued to hear it).
            self.released = False
            self.woken = True
            return True
        if self.turn == place:
            self.turn = None  # woken while between two waits: it is our turn now
            return True
        if waits.interrupted:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[place] = fut
        waits.parked.add(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
            if waits.interrupted and self.waiters.get(place) is fut:
                del self.waiters[place]  # ended by interrupt(), not woken: no turn was given
                return False
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # woken in the loop turn the timer fired: the wake-up counts (wake() took us off)
            # The fallback: no word came. Keep our place in line until we depart.
            if self.turn == place:
                self.turn = None  # woken in the same loop turn as the timer: our turn
                return True
            if place in self.waiters:
                self.waiters[place] = None
            return False
        except BaseException:
            if (fut.done() and not fut.cancelled()) or self.turn == place:
                # Woken, and cancelled in the same loop turn (its own timeout, a task group):
                # it will not try, so the turn passes on.
                self.turn = None
                self.woken = False
                waits.wakeups += self.wake()
            self.waiters.pop(place, None)
            raise
        finally:
            waits.parked.discard(fut)
        return True  # woken: wake() took us off the line

    def depart(self, place: int) -> bool:
        """The waiter with ticket *place* leaves the line (acquired, gave up, cancelled).

        If it was woken between two waits and never tried, the turn passes on: True when that woke one.
        """
        self.waiters.pop(place, None)
        if self.turn != place:
            return False
        self.turn = None
        self.woken = False
        return self.wake()

    def done(self) -> bool:
        """The woken waiter finished trying: a release heard meanwhile wakes the next one (True)."""
        self.woken = False
        if self.missed:
            self.missed -= 1
            return self.wake()
        return False

    def release(self) -> bool:
        """A release was heard: wake the oldest waiter (True), or keep it for when the woken one is done."""
        if self.woken:
            self.missed += 1
            return False
        return self.wake()

    def wake(self) -> bool:
        """Wake the oldest waiter (True); with none queued, let the next one go at once."""
        if not self.waiters:
            self.released = True  # heard by no one yet: the next waiter must not wait for the next one
            return False
        place = min(self.waiters)
        fut = self.waiters.pop(place)
        self.woken = True
        if fut is not None and not fut.done():
            fut.set_result(None)
        else:
            self.turn = place  # between two waits (its timer just fired): its next wait returns at once
        return True
