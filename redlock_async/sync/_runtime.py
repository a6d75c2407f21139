"""What one blocking ``Redlock`` runs on, per process: its async twin and the shared background loop.

The twin (an async ``Redlock``) is made at once in the caller's thread (bad settings raise there; no
I/O, no thread), and used only on the portal's loop. In a forked child the parent's twin is left
alone (:func:`_portal.orphan`) and a new one is made from the same arguments at first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from redlock_async.client import Redlock as AsyncRedlock
from redlock_async.sync import _portal
from redlock_async.sync._portal import Portal

T = TypeVar("T")


class Runtime:
    """The async twin of one blocking Redlock in this process, and the portal it runs on."""

    __slots__ = ("_build", "_generation", "_portal", "closed", "holders", "twin")

    def __init__(self, build: Callable[[], AsyncRedlock]) -> None:
        self._build = build
        self.twin = build()
        self._generation = _portal.generation()
        self._portal: Portal | None = None
        self.holders: set[asyncio.Task[None]] = set()
        """Holder tasks of this Redlock's locks (loop thread only): waited for at close."""
        self.closed = False

    @property
    def generation(self) -> int:
        return self._generation

    def current(self) -> AsyncRedlock:
        """This process's twin (made anew in a forked child)."""
        if self._generation != _portal.generation():
            _portal.orphan((self.twin, self.holders))  # the parent's: never touched here
            self.twin = self._build()
            self._generation = _portal.generation()
            self._portal = None
            self.holders = set()
        return self.twin

    def portal(self) -> Portal:
        """The loop to run on: joined at first use in this process; refused from an event loop's thread."""
        self.current()
        if self.closed:
            raise RuntimeError("this Redlock is closed: make a new one")
        portal = self._portal
        _portal.check_caller(portal)  # before a thread is started for a caller that is refused
        if portal is None:
            portal = self._portal = _portal.join()
        return portal

    def call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` on the loop, block until it ends."""
        return self.portal().call(make)

    def close(self) -> None:
        """Close the twin (its locks still held are released, their holders told LockLost) and leave the portal."""
        if self.closed:
            return
        self.current()
        portal = self._portal
        if portal is None:
            self.closed = True  # never used in this process: nothing was started
            return
        _portal.check_caller(portal)
        self.closed = True
        try:
            portal.call(self._aclose)
        finally:
            self._portal = None
            _portal.leave()

    async def _aclose(self) -> None:
        await self.twin.aclose()
        if self.holders:  # they leave their blocks now (told LockLost by the close)
            await asyncio.wait(self.holders)
