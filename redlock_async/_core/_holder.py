"""Who holds a lock, for nested acquires: the task, or the thread a blocking API's holder task stands in for.

Inside ``async with`` a lock is bound to its holder (``Cluster.bind``), and an acquire by that same
holder of what it holds already raises ``NestedAcquire`` at once: it would wait for itself. In asyncio
the holder is the task. The blocking API (``redlock_async.sync``) runs each acquisition in a holder
task of its own on the background loop, so a task is never "the same caller" there; its holder task
stands in for the calling thread (:func:`stand_in`), and the thread is the holder. Timeline::

    thread T: with lock:         -> holder task 1: stand_in(T), async with lock  (bound to T)
    thread T:   with other:      -> holder task 2: stand_in(T), acquire: T holds it -> NestedAcquire
    thread U:   with another:    -> holder task 3: stand_in(U), acquire: U holds nothing -> waits

Only the holder task itself stands in: tasks it starts are holders of their own, as in asyncio.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, NamedTuple

_stand_ins: dict[asyncio.Task[Any], threading.Thread] = {}  # loop threads only; each entry lives as its task's hold


def stand_in(thread: threading.Thread) -> None:
    """The current task holds for *thread* until :func:`step_down` (the blocking API's holder task)."""
    task = asyncio.current_task()
    assert task is not None
    _stand_ins[task] = thread


def step_down() -> None:
    """The current task no longer stands in for a thread."""
    task = asyncio.current_task()
    if task is not None:
        _stand_ins.pop(task, None)


def current() -> object | None:
    """The current holder: the thread the current task stands in for, else the task (None outside a task)."""
    task = asyncio.current_task()
    if _stand_ins and task is not None:  # (no blocking API in use: one dict test)
        return _stand_ins.get(task, task)
    return task


def of(task: asyncio.Task[Any]) -> object:
    """:func:`current`, given the current task (already at hand: ``async with``'s entry)."""
    return _stand_ins.get(task, task) if _stand_ins else task


class Described(NamedTuple):
    """A holder in words, for NestedAcquire."""

    kind: str
    """``task`` or ``thread``."""
    who: str
    """``this task (Task-3)``, ``this thread (MainThread)``."""
    block: str
    """The block it holds in: ``an enclosing `async with```."""


def described(holder: object) -> Described:
    """*holder* in words for NestedAcquire."""
    if isinstance(holder, threading.Thread):
        return Described("thread", f"this thread ({holder.name})", "an enclosing `with` (or acquire())")
    name = holder.get_name() if isinstance(holder, asyncio.Task) else "?"
    return Described("task", f"this task ({name})", "an enclosing `async with`")
