"""A lock's parts: the acquire strategies (one name, several names, a semaphore permit, queued or
by release words), keeping a held lease (the keeper), the ``async with`` guard and the events it
emits. Imports the wings below it (``_core`` to ``_shared``).

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._lock import _guard as guard
from redlock_async._lock._emitter import emit, emit_lost, heard
from redlock_async._lock._in_line import line_token, never_refused, wait_in_line
from redlock_async._lock._keeper import Keeper, Successor, hand_over, handed_over, loss
from redlock_async._lock._semaphore import MAX_LIMIT, Permit, QueuedPermit, check_limit
from redlock_async._lock._strategies import Many, Queued, Strategy, Words

__all__ = [
    "MAX_LIMIT",
    "Keeper",
    "Many",
    "Permit",
    "Queued",
    "QueuedPermit",
    "Strategy",
    "Successor",
    "Words",
    "check_limit",
    "emit",
    "emit_lost",
    "guard",
    "hand_over",
    "handed_over",
    "heard",
    "line_token",
    "loss",
    "never_refused",
    "wait_in_line",
]
