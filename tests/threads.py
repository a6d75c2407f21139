"""Other threads for the blocking API's tests: nesting there is by thread, so "held elsewhere" is another thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

T = TypeVar("T")


def elsewhere(fn: Callable[[], T], within: float = 60.0) -> T:
    """``fn()`` run in another thread: its result, or its exception raised here."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="elsewhere")
    thread.start()
    thread.join(within)
    assert outcome, f"{fn!r} still runs in another thread after {within} s"
    ok, value = outcome[0]
    if not ok:
        raise value
    result: T = value
    return result


@contextlib.contextmanager
def held_elsewhere(lock: AbstractContextManager[object], within: float = 60.0) -> Iterator[None]:
    """*lock* entered by another thread for the length of the block (and left there after it)."""
    entered, leave = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            with lock:
                entered.set()
                leave.wait(within)
        except BaseException as exc:
            failed.append(exc)
            entered.set()

    thread = threading.Thread(target=hold, name="holder-elsewhere")
    thread.start()
    try:
        entered.wait(within)
        if failed:
            raise failed[0]
        yield
    finally:
        leave.set()
        thread.join(within)
    if failed:
        raise failed[0]
