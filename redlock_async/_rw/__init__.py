"""The read/write lock's parts: its requests, strategies and queued variants. Imports the wings
below it (``_core`` to ``_lock``).

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._rw._strategies import QueuedReader, QueuedWriter, Reader, Writer

__all__ = ["QueuedReader", "QueuedWriter", "Reader", "Writer"]
