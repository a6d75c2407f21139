"""A lease held on the loop thread while the caller's body runs on its own thread.

The async library keeps a lease inside ``async with lock:`` (or an election's ``campaign()``): the
watchdog extends it and, when it cannot, cancels the task in the block and ``LockLost`` comes out.
A blocking body cannot be cancelled, so a *holder task* sits in that block for it, waiting for the
body to end. Timeline::

    caller: acquire() ──> holder task: async with lock ── entered ──> waits ...
    caller: body runs                 (watchdog extends the lease meanwhile)
    loss:                             watchdog cancels the holder -> LockLost:
                                      lost.set(), the main thread interrupted if asked
    caller: release() ──> holder task: leaves the block (release), LockLost raised to the caller

So the front is the async library's own ``async with``, on a task of the loop thread, never a
second implementation of the lease.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from redlock_async._core import holder as _holder
from redlock_async.errors import LockLost
from redlock_async.sync._interrupt import Interrupter, check_supported
from redlock_async.sync._portal import Portal, Reply

T = TypeVar("T")


class Holding(Generic[T]):
    """The holder of one acquisition at a time: entered by :meth:`enter`, left by :meth:`leave`."""

    __slots__ = ("_interrupter", "_leave", "_mutex", "_task", "error", "lost", "thread")

    def __init__(self, *, interrupt_main: bool = False) -> None:
        if interrupt_main:
            check_supported()
        self._interrupter = Interrupter() if interrupt_main else None
        self.lost = threading.Event()
        """Set (from the loop thread) when the current acquisition's lease is lost."""
        self.error: LockLost | None = None
        """The current (or last) acquisition's loss."""
        self._task: asyncio.Task[None] | None = None
        self._leave: BlockExit | None = None
        self.thread: threading.Thread | None = None
        """The thread that is acquiring or holds it (from :meth:`claim` to the end of :meth:`leave`)."""
        self._mutex = threading.Lock()  # two threads claiming at once: one wins

    @property
    def active(self) -> bool:
        """True from a successful :meth:`enter` to the matching :meth:`leave` (whatever happened meanwhile)."""
        return self._task is not None

    def claim(self) -> threading.Thread | None:
        """Take this holding for the current thread, for one acquisition: None when taken, else the thread
        that is acquiring or holds it (one acquisition at a time)."""
        with self._mutex:
            if self.thread is not None:
                return self.thread
            self.thread = threading.current_thread()
            return None

    def unclaim(self) -> None:
        """Give back a claim that was not entered (:meth:`enter` gives it back when it fails)."""
        self.thread = None

    def enter(self, portal: Portal, cm: Callable[[], AbstractAsyncContextManager[T]], track: set[Any]) -> T:
        """Enter ``cm()`` on the loop thread and keep it entered; its value (raises what ``__aenter__`` raises).

        The current thread must have claimed it (:meth:`claim`); the holder task stands in for that thread
        (``_holder``: its nested acquires are refused). *track* is the set the holder task is kept in while
        it runs (the Redlock's, to wait for at close).
        """
        thread = threading.current_thread()
        assert self.thread is thread, "claim() first"
        try:
            return self._enter(portal, cm, track, thread)
        except BaseException:
            if self._task is None:
                self.thread = None
            raise

    def _enter(
        self,
        portal: Portal,
        cm: Callable[[], AbstractAsyncContextManager[T]],
        track: set[Any],
        thread: threading.Thread,
    ) -> T:
        self.lost.clear()
        self.error = None
        reply = Reply()
        leave = BlockExit()
        try:
            # One hop to the loop and one back: the holder task answers as soon as it is inside the block.
            portal.loop.call_soon_threadsafe(self._start, cm, reply, leave, track, thread)
            value: T = reply.wait(portal.loop)
            self._task, self._leave = reply.task, leave
            if self._interrupter is not None:
                self._interrupter.arm()
                if self.lost.is_set():  # lost before the interrupter was armed: say it now
                    assert self.error is not None
                    raise self.error
        except BaseException:
            # Interrupted (Ctrl-C), lost while entering, or refused: nobody is left holding it unknowingly.
            self._unwind(portal.loop, reply)
            raise
        return value

    def _unwind(self, loop: asyncio.AbstractEventLoop, reply: Reply) -> None:
        """After an acquisition was cut short, wherever: no handler left armed, the holder ended (cancelled:
        an acquire leaves nothing behind, a holder inside its block leaves it and releases), this holding free."""
        while True:
            try:
                if self._interrupter is not None:
                    self._interrupter.disarm()  # first: the holder's loss below interrupts nobody
                reply.abandon(loop)
                self._task = self._leave = None
                return
            except BaseException:  # a second interruption: the first one is the one raised
                continue

    def leave(self, portal: Callable[[], Portal]) -> None:
        """Leave the block on the loop thread (its exit releases); raises the acquisition's LockLost if it was lost.

        A holder that already left (its Redlock closed meanwhile) needs no call to the loop.
        """
        if self._interrupter is not None:
            self._interrupter.disarm()  # first: from here on, a loss no longer interrupts the main thread
        task, leave = self._task, self._leave
        if task is None or leave is None:
            raise RuntimeError("release() of a lock that is not held")
        try:
            if task.done():
                task.result()  # what made it leave (a LockLost is kept in self.error, not raised by the task)
            else:
                loop = portal().loop
                # Interrupted meanwhile: the release is not cut short; the holder is told to leave (if the
                # interruption came before it was) and waited for.
                reply = Reply(task, on_abandon=leave.event.set)
                try:
                    loop.call_soon_threadsafe(_leave, task, leave, reply)
                except BaseException:
                    reply.abandon(loop)
                    raise
                reply.wait(loop)
        finally:
            self._task = self._leave = None
            self.thread = None
        if self.error is not None:
            raise self.error

    def _start(
        self,
        cm: Callable[[], AbstractAsyncContextManager[T]],
        reply: Reply,
        leave: BlockExit,
        track: set[Any],
        thread: threading.Thread,
    ) -> None:
        """On the loop thread: start the holder task."""
        try:
            task = asyncio.get_running_loop().create_task(self._hold(cm(), reply, leave, thread))
        except BaseException as exc:
            reply.fail(exc)
            return
        reply.task = task
        task.add_done_callback(reply.settle)  # a task cancelled before its first step never answers itself
        track.add(task)
        task.add_done_callback(track.discard)

    async def _hold(
        self, cm: AbstractAsyncContextManager[T], reply: Reply, leave: BlockExit, thread: threading.Thread
    ) -> None:
        _holder.stand_in(thread)  # what this task holds, the thread holds (its nested acquires are refused)
        try:
            await self._hold_for(cm, reply, leave)
        finally:
            _holder.step_down()

    async def _hold_for(self, cm: AbstractAsyncContextManager[T], reply: Reply, leave: BlockExit) -> None:
        entered = False
        try:
            async with cm as value:
                entered = True
                reply.set(value)
                await leave.event.wait()
        except LockLost as lost:
            if not entered:
                reply.fail(lost)
                return
            self.error = lost
            self.lost.set()
            if self._interrupter is not None:
                self._interrupter.fire(lost)
        except BaseException as exc:
            if not entered:
                # LockNotAcquired, bad input, a closed Redlock; or the caller was interrupted (cancelled):
                # an acquire cut short has left nothing behind by the time it raises here.
                reply.fail(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            if leave.reply is not None:
                leave.reply.fail(exc)
                leave.reply = None
            raise
        if leave.reply is not None:
            leave.reply.set(None)  # at once, not a loop turn later from a done callback


class BlockExit:
    """The caller's word to a holder to leave its block, and the reply it waits on meanwhile."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reply: Reply | None = None


def _leave(task: asyncio.Task[None], leave: BlockExit, reply: Reply) -> None:
    """On the loop thread: let the holder leave its block; *reply* once it has (released, or told its loss)."""
    if task.done():
        reply.set_from(task)
        return
    leave.reply = reply
    leave.event.set()
