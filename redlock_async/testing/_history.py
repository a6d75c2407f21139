"""A record of critical sections, and a checker for the guarantees a lock gives.

Wrap each critical section in ``history.section(client, lock)``; afterwards
``history.check()`` raises ``AssertionError`` naming any two holders whose
sections overlapped in time, and any fencing token that went backwards. Times
come from ``time.monotonic()``, which is system-wide on Linux, so sections
recorded by several processes on one machine can be merged and checked.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from redlock_async.lock import Lock


@dataclass(frozen=True, slots=True)
class Section:
    """One critical section: who held the lock, with which tokens, from when to when (monotonic seconds)."""

    client: str
    token: str
    fencing_token: int | None
    start: float
    end: float


class History:
    """Critical sections recorded during a test, and their check."""

    def __init__(self) -> None:
        self.sections: list[Section] = []

    @contextlib.contextmanager
    def section(self, client: str, lock: Lock) -> Iterator[None]:
        """Record the block as a critical section of *client* holding *lock* (enter it once acquired)."""
        token, fencing_token = lock.token or "?", lock.fencing_token
        start = time.monotonic()
        try:
            yield
        finally:
            self.sections.append(Section(client, token, fencing_token, start, time.monotonic()))

    def overlaps(self) -> list[tuple[Section, Section]]:
        """Pairs of sections of different acquisitions that were open at the same time."""
        found: list[tuple[Section, Section]] = []
        latest: Section | None = None  # the section that ends last among those seen
        for section in sorted(self.sections, key=lambda s: s.start):
            if latest is not None and section.start < latest.end and section.token != latest.token:
                found.append((latest, section))
            if latest is None or section.end > latest.end:
                latest = section
        return found

    def fencing_regressions(self) -> list[tuple[Section, Section]]:
        """Consecutive sections (in time) whose fencing token did not grow."""
        fenced = sorted((s for s in self.sections if s.fencing_token is not None), key=lambda s: s.start)
        return [
            (before, after)
            for before, after in itertools.pairwise(fenced)
            if after.fencing_token is not None
            and before.fencing_token is not None
            and after.fencing_token <= before.fencing_token
        ]

    def check(self) -> None:
        """Raise AssertionError describing every overlap and fencing regression, if any."""
        problems = [
            f"overlap: {a.client} held it {a.start:.6f}-{a.end:.6f} while {b.client} entered at {b.start:.6f}"
            for a, b in self.overlaps()
        ] + [
            f"fencing token went backwards: {a.client} had {a.fencing_token}, then {b.client} got {b.fencing_token}"
            for a, b in self.fencing_regressions()
        ]
        if problems:
            raise AssertionError(
                f"{len(problems)} safety violations in {len(self.sections)} sections:\n" + "\n".join(problems[:20])
            )
