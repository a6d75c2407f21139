"""``interrupt_main=True``: a lost lease raises ``LockLost`` in the main thread, as Ctrl-C raises KeyboardInterrupt.

The loop thread learns of the loss; only a signal can make another thread raise. While a body that
asked for it runs in the main thread, a handler of :data:`SIGNAL` is installed; at a loss the loop
thread sends that signal to the main thread (``pthread_kill``), which interrupts a blocking sleep or
socket wait there, and the handler raises the lock's ``LockLost`` in the body. The handler raises
only while that body still runs: a signal that arrives after the body ended is dropped, and once no
body needs it the previous handler is put back (SIGURG's default is to ignore it, so a late signal
is harmless). What it cannot stop: a body inside C code that does not return to Python (it raises
when the call returns), or a body that catches the exception and goes on.

SIGURG is used because nothing sends it to a process that does not ask for it (it tells of
out-of-band TCP data on sockets that opted in with F_SETOWN): not SIGINT, which Celery's pool
children ignore and users bind to Ctrl-C, nor SIGUSR1/2, which Celery and gunicorn use.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

from redlock_async.errors import LockLost

SIGNAL: signal.Signals | None = getattr(signal, "SIGURG", None)
"""The signal sent to the main thread (POSIX only)."""


def check_supported() -> None:
    if SIGNAL is None or not hasattr(signal, "pthread_kill"):
        raise ValueError("interrupt_main=True needs POSIX signals (pthread_kill); use lock.lost or lock.check() here")


class Interrupter:
    """Raises one lock's ``LockLost`` in the main thread while that lock's body runs there."""

    __slots__ = ("pending", "running")

    def __init__(self) -> None:
        self.running = False
        self.pending: LockLost | None = None

    def arm(self) -> None:
        """In the main thread, as the body starts."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "interrupt_main=True raises LockLost in the main thread: acquire this lock there "
                "(in other threads, watch lock.lost or call lock.check())"
            )
        global _previous
        with _guard:
            if signal.getsignal(_signal()) is not _handler:
                _previous = signal.signal(_signal(), _handler)
            if self not in _armed:
                _armed.append(self)
            self.pending, self.running = None, True

    def fire(self, lost: LockLost) -> None:
        """In the loop thread, at the loss: interrupt the body if it still runs."""
        with _guard:
            if not self.running:
                return
            self.pending = lost
            signal.pthread_kill(threading.main_thread().ident or 0, _signal())

    def disarm(self) -> None:
        """In the main thread, as the body ends (before anything else: a late signal is then dropped).

        Idempotent, so that a call cut short by an interruption can be made again.
        """
        with _guard:
            self.running, self.pending = False, None
            if self in _armed:
                _armed.remove(self)
            if (
                not _armed
                and threading.current_thread() is threading.main_thread()
                and signal.getsignal(_signal()) is _handler
            ):
                signal.signal(_signal(), _previous if _previous is not None else signal.SIG_DFL)


_guard = threading.Lock()
_armed: list[Interrupter] = []
_previous: Any = None


def _forget_parent() -> None:
    global _guard
    _guard = threading.Lock()  # the parent's loop thread may have held it at the fork
    _armed.clear()  # the parent's bodies do not run here


os.register_at_fork(after_in_child=_forget_parent)


def _signal() -> signal.Signals:
    assert SIGNAL is not None  # check_supported() said so when the lock was made
    return SIGNAL


def _handler(signum: int, frame: FrameType | None) -> None:
    # Runs in the main thread between two bytecodes, maybe while that thread holds _guard: so no lock here.
    for interrupter in tuple(_armed):
        lost = interrupter.pending
        if lost is not None and interrupter.running:
            interrupter.pending = None
            raise lost
