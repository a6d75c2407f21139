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


class Reply:
    """One answer from the loop thread to a blocked caller: a result or an exception, crossing through a lock.

    ``task`` (set on the loop thread) is what an interrupted caller cancels.
    """

    __slots__ = ("_done", "_error", "_result", "answered", "task")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()  # released by the loop thread with the answer
        self.task: asyncio.Task[Any] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self.answered = False

    def set(self, result: Any) -> None:
        """On the loop thread: the answer (once)."""
        self._result, self.answered = result, True
        self._done.release()

    def fail(self, error: BaseException) -> None:
        """On the loop thread: the answer is this exception (once)."""
        self._error, self.answered = error, True
        self._done.release()

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

    def cancel(self) -> None:
        """On the loop thread: the caller was interrupted (Ctrl-C, a signal handler's exception)."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()

    def wait(self, loop: asyncio.AbstractEventLoop) -> Any:
        """On the caller's thread: block until answered, then return the result or raise.

        Interrupted while blocked (KeyboardInterrupt, or an exception raised by a signal handler),
        :attr:`task` is cancelled and the answer still waited for, so that what the task cleans up
        on cancellation (an acquire leaves no key behind) is done before the interruption goes on.
        """
        try:
            self._done.acquire()
        except BaseException:
            loop.call_soon_threadsafe(self.cancel)
            while True:
                try:
                    self._done.acquire()
                    break
                except BaseException:  # a second interruption: the first one is the one to raise
                    continue
            raise
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._result


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
        self.loop.call_soon_threadsafe(_start, reply, make)
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
