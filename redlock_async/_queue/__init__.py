"""The grant queue: a claim's place in one name's line on every node (the line of a lock, of a
semaphore's permits, of a read/write lock), its fencing, waiting for a grant, leaving the line and the
grant words. Imports ``_core``, ``_nodes``, ``_health`` and ``_rounds``.

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._queue import _claim as claim
from redlock_async._queue import _release as release
from redlock_async._queue import _wait as wait
from redlock_async._queue._claim import LISTENING, SUFFIXES, mark_key, queue_keys
from redlock_async._queue._grants import Grants, is_grant
from redlock_async._queue._lines import READER, WRITER, PermitLine, Permits, RwLine
from redlock_async._queue._release import release_permit

__all__ = [
    "LISTENING",
    "READER",
    "SUFFIXES",
    "WRITER",
    "Grants",
    "PermitLine",
    "Permits",
    "RwLine",
    "claim",
    "is_grant",
    "mark_key",
    "queue_keys",
    "release",
    "release_permit",
    "wait",
]
