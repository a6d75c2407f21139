"""The background event loop that the blocking API runs the async library on: one thread per process.

Blocking callers hand coroutines to :func:`call`, which runs them on the loop thread and blocks
until they end. The thread starts when the first sync ``Redlock`` needs it and stops when the last
one is closed (:func:`join` / :func:`leave`), so a closed program has no thread of ours left.

Why not anyio's ``from_thread`` blocking portal: it would become a runtime dependency for about a
hundred lines, its portal is not fork-aware (a child inherits a portal object whose thread does not
exist there), and each of its calls goes through a task group and cancel scopes where this goes
through one ``call_soon_threadsafe`` and one lock (the overhead is measured in
benchmarks/bench_sync.py).

Fork (Celery's prefork pool, gunicorn's sync workers): a child inherits the parent's loop, sockets
and objects but not its thread. At fork the child forgets the parent's loop (:func:`generation`
changes); the first use in the child starts the child's own loop, and the sync Redlocks build their
own connections there. The parent's objects are kept referenced in the child and never touched: no
byte goes out on a socket the parent still uses, and no finalizer closes anything of the parent's.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

THREAD_NAME = "redlock-sync-loop"

INSIDE_LOOP = (
    "the blocking API (redlock_async.sync) was called from a thread that runs an event loop, where it "
    "would block that loop (or deadlock): in async code use the async API, `from redlock_async import "
    "Redlock`, and `async with redlock.lock(...)`"
)


class Flag:
    """A one-shot flag set on the loop thread and waited for on another, safe to wait for again after an interruption.

    A ``threading.Lock`` released once is consumed by the acquire that gets it: a KeyboardInterrupt
    raised just after that acquire returned (the signal handler runs at the next bytecode) leaves the
    waiter unable to tell whether it got it, and waiting again then waits for ever. The flag is set
    before the release, so :meth:`wait` returns at once whenever it is set, whoever consumed the release.
    """

    __slots__ = ("_lock", "is_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released once, by set()
        self.is_set = False

    def set(self) -> None:
        """On the loop thread (again: nothing)."""
        if not self.is_set:
            self.is_set = True
            self._lock.release()

    def wait(self) -> None:
        """Block until set; an interruption raises here, and a later call waits on as if it had not come."""
        while not self.is_set:
            self._lock.acquire()


class Reply:
    """One answer from the loop thread to a blocked caller: a result or an exception.

    ``task`` (set on the loop thread when the reply starts it, or given) is the work behind the answer;
    an interrupted caller :meth:`abandon`-s it: *on_abandon* runs on the loop thread if given (the
    work is then waited for, not cancelled), else the task is cancelled.
    """

    __slots__ = ("_abandoned", "_answer", "_ended", "_error", "_on_abandon", "_result", "task")

    def __init__(self, task: asyncio.Task[Any] | None = None, on_abandon: Callable[[], object] | None = None) -> None:
        self._answer = Flag()
        self._ended = Flag()
        """Set once an abandoned reply's work is over."""
        self._abandoned = False
        self._on_abandon = on_abandon
        self.task = task
        self._result: Any = None
        self._error: BaseException | None = None

    @property
    def answered(self) -> bool:
        return self._answer.is_set

    def set(self, result: Any) -> None:
        """On the loop thread: the answer (once)."""
        self._result = result
        self._answer.set()

    def fail(self, error: BaseException) -> None:
        """On the loop thread: the answer is this exception (once)."""
        self._error = error
        self._answer.set()

    def settle(self, task: asyncio.Task[Any]) -> None:
        """On the loop thread, as *task* ends: answer with its end if it did not answer (cancelled before it ran)."""
        if not self.answered:
            self.set_from(task)

    def set_from(self, task: asyncio.Task[Any]) -> None:
        """On the loop thread: the answer is what *task* ended with (a done callback)."""
        self.task = None  # no cycle through the task's traceback
        if task.cancelled():
            self.fail(asyncio.CancelledError())
        elif (error := task.exception()) is not None:
            self.fail(error)
        else:
            self.set(task.result())

    def _abandon(self) -> None:
        """On the loop thread: the caller was interrupted; end the work (or let it end) and say when it has.

        Scheduled after what starts the task (the loop runs callbacks in order): no task here means
        none was started, or it ended and answered.
        """
        if self._abandoned:
            return
        self._abandoned = True
        if self._on_abandon is not None:
            self._on_abandon()
        task = self.task
        if task is None or task.done():
            self._ended.set()
            return
        if self._on_abandon is None:
            task.cancel()
        task.add_done_callback(lambda _: self._ended.set())

    def wait(self, loop: asyncio.AbstractEventLoop) -> Any:
        """On the caller's thread: block until answered, then return the result or raise.

        Interrupted (KeyboardInterrupt, or an exception raised by a signal handler), before the answer
        came or just after, the reply is :meth:`abandon`-ed and the interruption raised: always, even
        when the answer was a success (a holder's block entered is left again, its lock released).
        """
        try:
            self._answer.wait()
        except BaseException:
            self.abandon(loop)
            raise
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._result

    def abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the caller's thread, interrupted: cancel the task (or run *on_abandon*) and wait until its work is over.

        What the task cleans up on cancellation (an acquire leaves no key behind; a holder that
        entered its block leaves it, releasing) is done before the interruption goes on. Further
        interruptions meanwhile are dropped: the first one is the one the caller raises. Idempotent.
        """
        scheduled = False
        while True:
            try:
                if not scheduled:
                    if loop.is_closed():
                        return  # nothing runs there any more
                    loop.call_soon_threadsafe(self._abandon)  # twice if interrupted in here: harmless
                    scheduled = True
                self._ended.wait()
                return
            except BaseException:  # a second interruption: the first one is the one to raise
                continue


def _start(reply: Reply, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """On the loop thread: run ``make()`` as a task (it can be cancelled from the caller's side)."""
    try:
        task = asyncio.get_running_loop().create_task(make())
    except BaseException as exc:
        reply.fail(exc)
        return
    reply.task = task
    task.add_done_callback(reply.set_from)


class Portal:
    """An event loop running on a daemon thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=THREAD_NAME, daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                # As asyncio.run ends: what a user left running (a lock never released) is cancelled and awaited.
                left = asyncio.all_tasks(self.loop)
                for task in left:
                    task.cancel()
                if left:
                    self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.run_until_complete(self.loop.shutdown_default_executor())  # its threads (getaddrinfo)
            finally:
                asyncio.set_event_loop(None)
                self.loop.close()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` on the loop and block until it ends; its result, or its exception raised here."""
        reply = Reply()
        try:
            self.loop.call_soon_threadsafe(_start, reply, make)
        except BaseException:
            reply.abandon(self.loop)  # interrupted: the task, if it was scheduled, is cancelled and waited for
            raise
        result: T = reply.wait(self.loop)
        return result

    def stop(self) -> None:
        """Stop the loop and join its thread (what is still scheduled on it is dropped)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


# -- the process's portal -------------------------------------------------------------------------

_guard = threading.Lock()
_portal: Portal | None = None
_users = 0
_generation = 0
_orphans: list[object] = []
"""In a forked child: the parent's loop and objects, kept referenced so that no finalizer touches them."""


def generation() -> int:
    """A number that changes in a forked child: objects made under another number belong to the parent."""
    return _generation


def orphan(thing: object) -> None:
    """Keep *thing* (an object of the parent's, found in a forked child) alive and untouched."""
    _orphans.append(thing)


def join() -> Portal:
    """The process's portal, started if none runs; the caller is counted as a user until :func:`leave`."""
    global _portal, _users
    with _guard:
        if _portal is None:
            _portal = Portal()
        _users += 1
        return _portal


def leave() -> None:
    """A user is done with the portal; the last one out stops its thread."""
    global _portal, _users
    with _guard:
        _users -= 1
        if _users > 0 or _portal is None:
            return
        portal, _portal = _portal, None
    portal.stop()


def check_caller(portal: Portal | None) -> None:
    """Refuse a blocking call from a thread that runs an event loop (the portal's own included)."""
    if portal is not None and threading.get_ident() == portal.ident:
        raise RuntimeError(INSIDE_LOOP + " (this was the blocking API's own loop: a callback such as on_event)")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(INSIDE_LOOP)
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return
        raise RuntimeError(INSIDE_LOOP.replace("an event loop", "trio"))


def _forget_parent() -> None:
    """In a forked child: the parent's loop thread does not exist here; its loop and sockets stay the parent's."""
    global _guard, _portal, _users, _generation
    _guard = threading.Lock()  # another thread of the parent may have held it at the fork
    if _portal is not None:
        orphan(_portal)
    _portal, _users = None, 0
    _generation += 1


os.register_at_fork(after_in_child=_forget_parent)
