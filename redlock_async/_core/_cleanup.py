"""Cleanup that a cancellation cannot cut short.

anyio (FastAPI, Starlette) cancels a task again at every await while its
scope is cancelled, where asyncio cancels once; a close that awaits would
stop at its first await and leave sockets and tasks behind. So the cleanup
runs as a task of its own, shielded, and the caller waits for it to end
whatever is thrown at it, then lets its own cancellation go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def complete(coro: Coroutine[Any, Any, T]) -> T:
    """Await *coro* to its end even when cancelled, once or at every await; then re-raise the cancellation."""
    task = asyncio.get_running_loop().create_task(coro)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError as exc:
            if task.done():
                if task.cancelled():
                    raise  # the cleanup itself was cancelled (the loop is closing)
                result = task.result()
                break
            cancelled = exc  # ours, not the cleanup's: wait on, and say it afterwards
    if cancelled is not None:
        raise cancelled
    return result
