"""The library's one clock: monotonic seconds, read through :func:`now`.

Every time redlock_async reads (a lease's start and end, a node's round trip, a
deadline's lateness) comes from here; timers are armed on the event loop by delay
(``call_later``), so the loop's own clock only ever counts those delays. Tests replace
the clock with :func:`use` (for example with the event loop's, when that loop runs on
virtual time) and so drive every timing decision of the library from one source.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

now: Callable[[], float] = time.monotonic
"""The clock (seconds, monotonic). Read it as ``_clock.now()``: :func:`use` swaps it."""


@contextmanager
def use(clock: Callable[[], float]) -> Iterator[None]:
    """Read *clock* instead of time.monotonic inside the block (tests only: not thread-safe)."""
    global now
    previous, now = now, clock
    try:
        yield
    finally:
        now = previous
